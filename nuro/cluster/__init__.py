"""The cluster's shape as data: its description, the Ansible inventory that holds it, the Slurm files
rendered from it."""
