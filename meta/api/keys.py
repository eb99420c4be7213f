"""Typed application keys (aiohttp AppKey) for the objects handlers need."""

from aiohttp import web

from ..service import MetaService
from .metrics import MetaMetrics

SERVICE = web.AppKey("service", MetaService)
METRICS = web.AppKey("metrics", MetaMetrics)
ADMISSIONS = web.AppKey("admissions", dict)  # name -> admission.Admission
