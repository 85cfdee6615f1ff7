"""Inference services: the router in front of a service's replicas (router.py), their readiness checks
(readiness.py)."""
