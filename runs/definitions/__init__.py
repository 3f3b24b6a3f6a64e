"""Agents a tenant defines as data (a model, instructions, tools, approval rules, limits),
versioned in the tenant's schema and run by one operator agent, the runner (runner.py)."""
