"""Super Mario Bros: the Gymnasium env (env.py) on a bare NES emulator, nes-py's (emulator.py) or stable-retro's
(retro.py), chosen by env.backend (backend.py); its RAM (ram.py), random stages (stages.py), reward (reward.py) and
action sets (actions.py)."""
