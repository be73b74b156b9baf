"""Fleet state: each engine's load (waiting, running, KV usage) as the load gate reads it.

- `scrape`: reading one engine's load gauges from its `/metrics/?name[]=...` (or `/metrics`),
  and scraping rounds over every active engine; used by each ext_proc replica
  (`load_gate.source: scrape`) and by the collector; `keepalive`: the minimal HTTP/1.1 client
  its GETs go through (one kept-alive connection per engine).
- `collector`: the control-plane leader's one scraper for the whole gateway
  (`load_gate.source: collector`), whose rounds the admin API streams to every replica.
- `feed`: an ext_proc replica's side of that stream: figures onto its load board, aged.
- `prefill_mix`: the mean prefill a waiting request is assumed to need (the figures' waiting
  counts in seconds).
"""
