"""The path of an inbound message: authorize, record, then a command or the dispatcher
(README.md, How a message travels).
"""
