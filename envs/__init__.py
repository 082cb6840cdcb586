"""The envs, as both sides of the wire build or size them: the factory (factory.py), EnvSpec (spec.py) and the value
bounds the head accepts (bounds.py), the config rules that need to know the envs (checks.py), Mario (mario/), Atari
(atari.py; both on the emulator envs' base, emulator_env.py), image observations (image_obs.py) and the counting env
of the tests (testing.py).

Imports shared/ only, and no torch (tests/test_boundaries.py); the emulators are imported when an env is built."""
