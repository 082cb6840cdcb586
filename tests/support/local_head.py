"""A minimal head (weight publisher + consolidation thread) for tests, benches and tools.

The real head wires the same two parts into the learner; this keeps the wiring in one place
for everything else that needs collectors to talk to something real.
"""

from __future__ import annotations

import os
import shutil

import zmq

from ingest.consolidation import ConsolidationThread
from ingest.consolidation_types import ReplaySink
from ingest.registration import Registrar
from learner.broadcast import WeightPublisher
from shared.config import Config
from shared.keys import load_server
from shared.protocol import ObsSpec
from shared.tempdirs import owned_tempdir


class LocalHead:
    """Binds control on `tcp://bind:port` (port 0 = ephemeral) and weights on ipc + tcp."""

    def __init__(self, config: Config, replay: ReplaySink, spec: ObsSpec, port: int | None = None) -> None:
        t = config.transport
        self.ctx = zmq.Context()
        self._dir = owned_tempdir()
        curve = load_server(t.curve_keys_dir) if t.curve_keys_dir else None
        self.registrar = Registrar(spec, {}, self.ctx, transport=t, collectors=config.collectors,
                                   replay=config.replay, welcome_config=config.to_dict(),
                                   control_endpoint=f"tcp://{t.bind}:{t.port if port is None else port}")
        # bound first: it starts the ZAP authenticator the publisher's CURVE socket needs
        self.consolidation = ConsolidationThread(replay, spec, self.registrar, transport=t,
                                                 collectors=config.collectors,
                                                 episode_window=config.logging.episode_window)
        self.publisher = WeightPublisher(
            [f"ipc://{os.path.join(self._dir, 'weights.ipc')}", f"tcp://{t.bind}:0"], context=self.ctx,
            heartbeat_s=min(1.0, t.head_timeout_s / 4), curve=curve,
        )
        self.registrar.weights_endpoints.update(
            {"local": self.publisher.endpoints[0], "remote": self.publisher.endpoints[1]})
        self.consolidation.latest_weight_version = lambda: self.publisher.version
        self.consolidation.start()

    @property
    def connect(self) -> str:
        return self.consolidation.control_endpoint

    def close(self) -> None:
        self.consolidation.stop()
        self.publisher.close()
        self.ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LocalHead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
