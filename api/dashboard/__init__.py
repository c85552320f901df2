"""The admin dashboard: an HTML page of the served models' throughput, latency and queues."""
