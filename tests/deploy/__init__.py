"""Deployment checks: compose.yaml, the Dockerfile, Kubernetes manifests, dashboards."""
