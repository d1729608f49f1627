"""Indexes over fingerprints: Manku's permuted-table designs, the Hamming index, and MinHash LSH banding."""
