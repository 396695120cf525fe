"""Prompts no one typed: cron schedules and signed webhooks (docs/automation.md)."""
