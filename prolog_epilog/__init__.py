"""Slurm Prolog/Epilog entry points, run by slurmd as root on every allocated node. Import as nuro.prolog_epilog."""
