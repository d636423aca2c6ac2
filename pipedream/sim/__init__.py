"""The cluster simulator's parts: links (:mod:`.network`), action costs (:mod:`.costs`), the event loop
(:mod:`.engine`) and plots (:mod:`.plots`). The public entry points are in :mod:`pipedream.simulator`."""
