"""The job spec: what a user asks to run, checked against strict patterns before anything renders or submits.

* ``fields``: value kinds (allow-list patterns, numbers, time limits, paths, dataset references, env, args);
* ``options``: ``SPEC_OPTIONS``, the one declaration table (YAML keys, flags, defaults, units, help, docs);
* ``spec``: ``JobSpec`` and ``build_spec`` / ``load_spec_file`` (every problem reported at once).

Example::

    from nuro.jobspec import build_spec, load_spec_file
    spec = build_spec(load_spec_file("train.yaml"), {"nodes": "4"})
"""

from nuro.jobspec.fields import FieldError, is_digest_ref
from nuro.jobspec.options import SPEC_OPTIONS, Opt, click_options, flag_values, options_markdown
from nuro.jobspec.spec import JobSpec, SpecError, build_spec, flatten, load_spec_file, split_code_flag

__all__ = [
    "SPEC_OPTIONS",
    "FieldError",
    "JobSpec",
    "Opt",
    "SpecError",
    "build_spec",
    "click_options",
    "flag_values",
    "flatten",
    "is_digest_ref",
    "load_spec_file",
    "options_markdown",
    "split_code_flag",
]
