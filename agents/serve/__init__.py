"""Serve: what enters is HTTP requests (hardened: :mod:`.http_guard`); what leaves is JSON read
from the stored estimates (:mod:`.web`, choosing and reshaping them: :mod:`.selection`), the live
page and its assets (:mod:`.ui`, ``static/``) and ``/healthz`` (docs/api.md)."""
