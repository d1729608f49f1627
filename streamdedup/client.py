"""The documented ``from streamdedup.client import PageProducer, VerdictConsumer``.

The clients live in :mod:`streamdedup.crawler.client`; this name stays for code that already uses it.
"""

from streamdedup.crawler.client import OutputConsumer, OutputRecord, PageProducer, VerdictConsumer, VerdictRecord

__all__ = ["OutputConsumer", "OutputRecord", "PageProducer", "VerdictConsumer", "VerdictRecord"]
