"""The documented Scrapy setting ``ITEM_PIPELINES = {"streamdedup.scrapy_pipeline.StreamdedupPipeline": 300}``.

The pipeline lives in :mod:`streamdedup.crawler.scrapy_pipeline`; this name stays for settings
files that already use it.
"""

from streamdedup.crawler.scrapy_pipeline import StreamdedupPipeline

__all__ = ["StreamdedupPipeline"]
