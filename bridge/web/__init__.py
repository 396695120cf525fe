"""The web console: runs, requests waiting for a person, spend, audit and the cluster (docs/web.md).

:func:`bridge.web.app.web_app` builds it as an aiohttp application that the
service mounts on its private HTTP listener. Everything it shows is read from
the database, so every replica serves the same view.
"""
