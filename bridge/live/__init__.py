"""What a person does to a run while it works: controls, approvals, questions, plans, rules
(docs/live-runs.md).
"""
