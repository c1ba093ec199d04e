"""Scheduling policies. Each module solves ptsolve.policies.model.Problem; solver imports stay lazy."""
SOLVERS = ("greedy", "cpsat", "milp", "exhaustive", "cpsat-orders")
