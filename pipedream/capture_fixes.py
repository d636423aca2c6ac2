"""What a user can do when no tracer captures their model: the fix named at the end of the capture's ``error:``
line (:func:`pipedream.capture.capture_ops`), chosen from the tracers' reasons."""

from __future__ import annotations

_FIXES = (  # (words of a tracer's reason, what the user can do), the first that matches
    (("data-dependent", "control flow", "guard on"),
     "make that code traceable: no Python branch on a tensor's value (torch.where instead of if), or a config option "
     "that skips it"),
    (("lifted_tensor",),
     "that layer builds a tensor from Python values while it runs (a cache, torch.tensor(...)): make it a buffer "
     "(register_buffer) or turn off the config option that builds it"),
    (("dtype", "scalar type", "shape", "size of tensor", "mat1", "expected"),
     "check the data against the model: the inputs' shapes and dtypes (token ids are int64)"),
)


def fix_for(failures: list[str]) -> str:
    """What a user can do about the tracers' reasons ``failures``: make the code traceable (a branch on a tensor's
    value), fix the data (a shape or dtype error), else make it traceable or hand over the layers."""
    text = " ".join(failures).lower()
    for words, fix in _FIXES:
        if any(w in text for w in words):
            return fix
    return ("make that code traceable (no Python branch on a tensor's value, no Python object built from one), or "
            "return an nn.Sequential of layers")
