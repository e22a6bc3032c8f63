"""The parts of one worker process, assembled (agents/app.py builds them): its context, the ingest
service (none when the worker only serves), the estimate refresher and the adaptive controller.
The HTTP views (agents/serve/) read them from here, so the stages below never refer to each
other through the context."""
from __future__ import annotations

from dataclasses import dataclass

from ldpstream.agents.context import Context
from ldpstream.agents.control.controller import Controller
from ldpstream.agents.ingest.acks import AckReconciler
from ldpstream.agents.ingest.service import IngestService
from ldpstream.agents.refresh.refresher import Refresher


@dataclass
class Worker:
    ctx: Context
    #: consumes ``ldp.reports.*`` into Redis (agents/ingest/); None for a serve-only worker
    ingest: IngestService | None
    #: refreshes the estimates (agents/refresh/)
    refresher: Refresher
    #: runs the adaptive steps and publishes their states (agents/control/controller.py)
    controller: Controller
    #: acknowledged equals counted (agents/ingest/acks.py); None without fleet secrets
    acks: AckReconciler | None = None
