"""web_search backends: a local BM25 index over a corpus (bm25s) and an HTTP search provider (Serper-style JSON POST)
with an optional page fetcher. Both drop results from blocked domains (the benchmarks' own hosting)."""

from __future__ import annotations

import html
import logging
import os
import re
from urllib.parse import urlparse

import httpx


class WebError(Exception):
    """A search that could not be served (provider error, bad response)."""


def is_blocked(url: str, blocked: tuple[str, ...]) -> bool:
    """A blocked entry is a host ("example.org", also matching subdomains) or a host/path prefix
    ("huggingface.co/datasets/x/omnigaia"); matching is case-insensitive."""
    u = urlparse(url if "://" in url else f"https://{url}")
    host = (u.hostname or "").lower()
    hostpath = host + (u.path or "").lower()
    for b in blocked:
        b = b.lower().strip().removeprefix("https://").removeprefix("http://").rstrip("/")
        if not b:
            continue
        if "/" in b:
            if hostpath.startswith(b) or hostpath.startswith("www." + b):
                return True
        elif host == b or host.endswith("." + b):
            return True
    return False


DEFAULT_STEMMER = "english"  # tools.web_stemmer: a PyStemmer (Snowball) algorithm; "" searches the words as written


class BM25Index:
    """BM25 over `title + text` of corpus docs (built once per corpus and stemmer, and reused). With a stemmer
    (PyStemmer, e.g. "english") documents and queries are stemmed alike, so "lighthouses" finds "lighthouse"."""

    def __init__(self, corpus: list[dict], stemmer: str = DEFAULT_STEMMER):
        import bm25s

        self.corpus = corpus
        self._bm25s = bm25s
        self._stemmer = None
        if stemmer:
            import Stemmer

            self._stemmer = Stemmer.Stemmer(stemmer)
        logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG on import
        self.retriever = bm25s.BM25()
        toks = self._tokenize([f"{d.get('title', '')} {d.get('text', '')}" for d in corpus])
        self.retriever.index(toks, show_progress=False)

    def _tokenize(self, texts: list[str]):
        return self._bm25s.tokenize(texts, stopwords="en", stemmer=self._stemmer, show_progress=False)

    def search(self, query: str, k: int) -> list[tuple[dict, float]]:
        if not self.corpus:
            return []
        qt = self._tokenize([query])
        if not any(len(x) for x in qt.ids):
            return []
        k = min(k, len(self.corpus))
        ids, scores = self.retriever.retrieve(qt, k=k, show_progress=False)
        return [(self.corpus[int(i)], float(s)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


_INDEX_CACHE: dict[tuple[int, str], tuple[list[dict], BM25Index]] = {}
_INDEX_CACHE_SIZE = 16  # the shared corpus of a run plus the per-task corpora (task `documents`) in flight


def bm25_index(corpus: list[dict], stemmer: str = DEFAULT_STEMMER) -> BM25Index:
    """Reuse one index per corpus object and stemmer (the run's corpus is shared by every task; a task with its own
    `documents` has its own list; an index built with one stemmer never serves another). The cache keeps the most
    recently used indexes only."""
    key = (id(corpus), stemmer or "")
    hit = _INDEX_CACHE.pop(key, None)
    if hit is not None and hit[0] is corpus:
        _INDEX_CACHE[key] = hit  # most recent last
        return hit[1]
    idx = BM25Index(corpus, stemmer)
    _INDEX_CACHE[key] = (corpus, idx)
    while len(_INDEX_CACHE) > _INDEX_CACHE_SIZE:
        del _INDEX_CACHE[next(iter(_INDEX_CACHE))]
    return idx


def bm25_search(
    corpus: list[dict], query: str, top_k: int, blocked: tuple[str, ...], stemmer: str = DEFAULT_STEMMER
) -> list[dict]:
    """Top-k non-blocked docs as result dicts {title, link, snippet, date}."""
    if not corpus:
        return []  # no corpus (e.g. a task source that brings none): nothing to index
    hits = bm25_index(corpus, stemmer).search(query, top_k * 3 + 5)
    out = []
    for doc, _ in hits:
        if is_blocked(doc.get("url", ""), blocked):
            continue
        out.append(
            {
                "title": doc.get("title", ""),
                "link": doc.get("url", ""),
                "snippet": doc.get("text", ""),
                "date": doc.get("date", ""),
            }
        )
        if len(out) >= top_k:
            break
    return out


async def http_search(
    provider_url: str, api_key_env: str, query: str, top_k: int, blocked: tuple[str, ...], timeout_s: float = 30.0
) -> list[dict]:
    """Serper-style provider: POST {"q", "num"} with X-API-KEY; reads `organic` [{title, link, snippet, date}]."""
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["X-API-KEY"] = key
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            r = await client.post(provider_url, json={"q": query, "num": top_k}, headers=headers)
    except httpx.HTTPError as e:
        raise WebError(f"search provider unreachable: {type(e).__name__}") from None
    if r.status_code != 200:
        raise WebError(f"search provider returned HTTP {r.status_code}")
    try:
        data = r.json()
    except ValueError:
        raise WebError("search provider returned a non-JSON body") from None
    organic = data.get("organic") if isinstance(data, dict) else None
    if not isinstance(organic, list):
        raise WebError("search provider response has no 'organic' list")
    out = []
    for item in organic:
        if not isinstance(item, dict) or not item.get("link"):
            continue
        if is_blocked(str(item["link"]), blocked):
            continue
        out.append({k: str(item.get(k, "")) for k in ("title", "link", "snippet", "date")})
        if len(out) >= top_k:
            break
    return out


def html_to_text(body: str) -> str:
    body = re.sub(r"(?is)<(script|style)[^>]*>.*?</\1>", " ", body)
    body = re.sub(r"(?s)<[^>]+>", " ", body)
    return re.sub(r"\s+", " ", html.unescape(body)).strip()


async def fetch_page(url: str, blocked: tuple[str, ...], max_chars: int, timeout_s: float = 20.0) -> str:
    """Plain text of a page (refuses blocked domains)."""
    if is_blocked(url, blocked):
        raise WebError(f"blocked domain: {urlparse(url).hostname}")
    try:
        async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=True) as client:
            r = await client.get(url)
    except httpx.HTTPError as e:
        raise WebError(f"page fetch failed: {type(e).__name__}") from None
    if r.status_code != 200:
        raise WebError(f"page fetch returned HTTP {r.status_code}")
    return html_to_text(r.text)[:max_chars]
