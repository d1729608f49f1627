"""Crawler-side clients: the pages producer, the verdict and output consumers, the Scrapy pipeline (aiokafka, no faust)."""
