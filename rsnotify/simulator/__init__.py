"""``rsnotify simulate``: a changing ResourceSync Source served over HTTP.

Layers, innermost first:

* :mod:`.payload` -- resource bytes as a pure function of (seed, loc, version);
* :mod:`.source` -- the Source as a deterministic state machine (no I/O, no clock);
* :mod:`.site` -- request path -> cached bytes with ETag / Last-Modified;
* :mod:`.server` -- the aiohttp application, the rate-driven change generator
  and the control endpoints under ``/_simulator/``;
* :mod:`.diskwriter` -- ``--dir``: the same bytes as static files;
* :mod:`.command` -- the CLI.
"""

from .source import Layout, SimulatorError, Source, Weights

__all__ = ["Layout", "SimulatorError", "Source", "Weights"]
