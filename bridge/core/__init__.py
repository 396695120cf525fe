"""The bottom layer: types shared by every package, importing nothing of the project.

``model`` holds ids, messages, batches, replies and run reports;
``transport`` what a transport and the service exchange (inbound events,
acknowledgement, delivery and its errors); ``aio`` small asyncio helpers.
An import-linter contract (``make check``) keeps this package a leaf.
"""
