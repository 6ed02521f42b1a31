"""Tools: a registry with enforced allow-lists, timeouts, budgets and approvals.

Sits on ``knowledge``; ``graphs`` build on it. Empty until the tools issue lands: the
package exists now so that the layer contract is enforced from the first commit.
"""
