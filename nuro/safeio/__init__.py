"""File primitives for root working in directories a job's user controls, and team credential files."""
