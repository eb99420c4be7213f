"""Typed application keys (aiohttp AppKey) for the objects handlers need."""

from aiohttp import web

from ..service import MetaService
from .metrics import MetaMetrics
from .parked_polls import ParkedPolls

SERVICE = web.AppKey("service", MetaService)
METRICS = web.AppKey("metrics", MetaMetrics)
ADMISSIONS = web.AppKey("admissions", dict)  # name -> admission.Admission
PARKED_POLLS = web.AppKey("parked_polls", ParkedPolls)
