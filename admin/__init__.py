"""Admin-workstation tools (``nuro-admin``: policy, nodes, and the dev cluster's command group).
Import as nuro.admin."""
