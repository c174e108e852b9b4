"""The web console: ``rillet console`` serves a small operator UI over a cluster.

It is a client of the cluster like the CLI: everything it shows comes from the Admin,
Consumer and Producer APIs, so it runs anywhere a client can reach a broker. Pages are
rendered on the server (Jinja2 templates), live parts are swapped in by htmx from one
server-sent-events stream, and charts are drawn by uPlot; the three scripts are vendored
(static/vendor/VENDORED.md). List views read a cached snapshot of the cluster, refreshed
in the background, so a page costs the same on 10,000 partitions as on ten
(docs/console.md).
"""
