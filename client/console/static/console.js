// Small glue for the console's pages; the vendored htmx and uPlot do the real work.
