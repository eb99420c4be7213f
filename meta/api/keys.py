"""Typed application keys (aiohttp AppKey) for the objects handlers need."""

from aiohttp import web

from ..service import MetaService
from .metrics import MetaMetrics
from .parked_polls import ParkedPolls
from .parked_watches import ParkedWatches

SERVICE = web.AppKey("service", MetaService)
METRICS = web.AppKey("metrics", MetaMetrics)
ADMISSIONS = web.AppKey("admissions", dict)  # name -> admission.Admission
PARKED_POLLS = web.AppKey("parked_polls", ParkedPolls)
PARKED_WATCHES = web.AppKey("parked_watches", ParkedWatches)
