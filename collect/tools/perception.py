"""Perception backends for subtitle_grounding / audio_scout / clip_grounding / frame_confirm.

- `annotation_search`: offline, searches an asset's annotation tracks (subtitles, audio segments, clip captions,
  frame notes) by query-token overlap within an optional time range.
- `MediaPerception`: real media. Frames for the requested range are cut with PyAV and sent as image data URIs (and
  audio segments as WAV `input_audio`) to an OpenAI-compatible multimodal endpoint through `collect.llm.ChatClient`
  (the same fault classes, retries, deadline, usage/cost accounting and redaction as the roles). The usage of every
  call, failed ones included, accumulates until `take_usage()`; the ToolBox hands it to the loop (role "perception").
"""

from __future__ import annotations

import base64
import io
import os
import re
from fractions import Fraction

from collect.config import EndpointConfig
from collect.llm import ChatClient, ChatError, Usage
from collect.tasks import AssetSpec

STOPWORDS = frozenset(
    "a an the of to in on at by for from and or is are was were be it its this that with as what which who whom "
    "name named between s".split()
)
TOOL_TRACK = {
    "subtitle_grounding": "subtitles",
    "audio_scout": "audio",
    "clip_grounding": "clips",
    "frame_confirm": "frames",
}


class PerceptionError(Exception):
    """A perception request that cannot be served (bad range, unreadable media, endpoint failure)."""


def tokens(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9']+", text.lower()) if w not in STOPWORDS and len(w) > 1}


def _entries(asset: AssetSpec, track: str) -> list[tuple[float, float, str]]:
    tr = asset.tracks
    if track == "subtitles":
        return [(s.start, s.end, s.text) for s in tr.subtitles]
    if track == "audio":
        return [(s.start, s.end, f"({s.kind}) {s.text}") for s in tr.audio]
    if track == "clips":
        return [(c.start, c.end, c.caption) for c in tr.clips]
    return [(f.t, f.t, f.description + (f" [on-screen text: {f.ocr}]" if f.ocr else "")) for f in tr.frames]


def annotation_search(
    asset: AssetSpec, tool: str, query: str, time_range: tuple[float, float] | None, top_k: int
) -> list[tuple[float, float, str]]:
    """Entries of the tool's track ranked by query-token overlap. With a time range, every entry overlapping it is
    a candidate (ranked by overlap, then time); without one, only entries sharing a query token are returned."""
    entries = _entries(asset, TOOL_TRACK[tool])
    q = tokens(query)
    if time_range is not None:
        lo, hi = time_range
        cands = [e for e in entries if e[1] >= lo and e[0] <= hi]
        scored = [(len(q & tokens(e[2])), e) for e in cands]
    else:
        scored = [(s, e) for e in entries if (s := len(q & tokens(e[2]))) > 0]
    scored.sort(key=lambda x: (-x[0], x[1][0]))
    hits = [e for _, e in scored[:top_k]]
    return sorted(hits, key=lambda e: e[0])


# --------------------------------------------------------------------------------------------------------------------
# Real media
# --------------------------------------------------------------------------------------------------------------------


def sample_times(lo: float, hi: float, n: int) -> list[float]:
    """n evenly spaced timestamps inside [lo, hi] (centres of n equal bins)."""
    if n <= 1 or hi <= lo:
        return [round((lo + hi) / 2, 3)]
    step = (hi - lo) / n
    return [round(lo + step * (i + 0.5), 3) for i in range(n)]


def extract_frames(path: str, times: list[float], max_side: int = 512) -> list[tuple[float, bytes]]:
    """Decode the frame at (or just after) each timestamp and encode it as JPEG. Returns (actual_t, jpeg bytes)."""
    import av

    out: list[tuple[float, bytes]] = []
    try:
        container = av.open(path)
    except Exception as e:  # noqa: BLE001 - PyAV raises many error types; all mean "unreadable"
        raise PerceptionError(f"cannot open video {path}: {e}") from None
    with container:
        stream = container.streams.video[0]
        tb = stream.time_base or Fraction(1, 1000)
        for t in times:
            container.seek(int(t / tb), stream=stream, backward=True, any_frame=False)
            chosen = None
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                ft = float(frame.pts * tb)
                chosen = (ft, frame)
                if ft + 1e-6 >= t:
                    break
            if chosen is None:
                continue
            ft, frame = chosen
            w, h = frame.width, frame.height
            scale = min(1.0, max_side / max(w, h))
            img = frame.reformat(
                width=max(2, int(w * scale) // 2 * 2), height=max(2, int(h * scale) // 2 * 2), format="yuvj420p"
            )
            out.append((round(ft, 3), _encode_jpeg(img)))
    return out


def _encode_jpeg(frame) -> bytes:
    import av

    ctx = av.CodecContext.create("mjpeg", "w")
    ctx.width, ctx.height = frame.width, frame.height
    ctx.pix_fmt = "yuvj420p"
    ctx.time_base = Fraction(1, 25)
    packets = list(ctx.encode(frame)) + list(ctx.encode(None))
    return b"".join(bytes(p) for p in packets)


def extract_audio_wav(path: str, lo: float, hi: float, rate: int = 16000) -> bytes:
    """Mono 16-bit PCM WAV of [lo, hi] seconds of the file's first audio stream."""
    import wave

    import av

    try:
        container = av.open(path)
    except Exception as e:  # noqa: BLE001
        raise PerceptionError(f"cannot open audio {path}: {e}") from None
    pcm = bytearray()
    with container:
        if not container.streams.audio:
            raise PerceptionError(f"{path} has no audio stream")
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
        for frame in container.decode(stream):
            if frame.pts is None or frame.time_base is None:
                continue
            t = float(frame.pts * frame.time_base)
            if t + frame.samples / frame.sample_rate < lo:
                continue
            if t > hi:
                break
            for rf in resampler.resample(frame):
                pcm += bytes(rf.planes[0])[: rf.samples * 2]
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(pcm))
    return buf.getvalue()


PROMPTS = {
    "subtitle_grounding": "Transcribe what is said in this segment that is relevant to: {query}",
    "audio_scout": "Describe the speech, sound events and music in this segment relevant to: {query}",
    "clip_grounding": "Describe what happens across these frames, in order, relevant to: {query}",
    "frame_confirm": "Read any on-screen text and describe what the frames show relevant to: {query}",
}


class MediaPerception:
    """Sends real media to an OpenAI-compatible multimodal chat endpoint through a `ChatClient` (created on first use,
    inside the running event loop). The API key is read from the env var the endpoint config names, never stored in
    observations. Transient faults are retried by the client; a final `ChatError` is a `PerceptionError` (a tool
    failure), and its usage (retries, faults) is kept all the same."""

    def __init__(self, endpoint: EndpointConfig, frames_per_range: int, media_root: str | None):
        self.endpoint = endpoint
        self.frames_per_range, self.media_root = frames_per_range, media_root
        self.usage = Usage(model=endpoint.model)
        self._client: ChatClient | None = None

    @classmethod
    def from_tools_config(cls, c) -> MediaPerception:
        """From a `collect.tools.ToolsConfig` (media_* fields)."""
        endpoint = EndpointConfig(
            base_url=c.media_base_url,
            model=c.media_model,
            api_key_env=c.media_api_key_env or None,
            timeout_s=c.media_timeout_s,
            max_tokens=512,
            temperature=0.0,
        )
        return cls(endpoint, c.frames_per_range, c.media_root)

    def take_usage(self) -> Usage:
        """The usage since the last call (and reset it)."""
        u, self.usage = self.usage, Usage(model=self.endpoint.model)
        return u

    def _path(self, asset: AssetSpec) -> str:
        if not asset.path:
            raise PerceptionError(f"asset {asset.id} has no media path")
        p = (
            asset.path
            if os.path.isabs(asset.path) or not self.media_root
            else os.path.join(self.media_root, asset.path)
        )
        if not os.path.exists(p):
            raise PerceptionError(f"media file for asset {asset.id} not found: {p}")
        return p

    def build_content(
        self, asset: AssetSpec, tool: str, query: str, time_range: tuple[float, float] | None
    ) -> list[dict]:
        """The user-message content parts: an instruction, then media parts each preceded by its timestamp."""
        path = self._path(asset)
        parts: list[dict] = [{"type": "text", "text": PROMPTS[tool].format(query=query)}]
        if asset.type == "image":
            mime = "image/png" if path.lower().endswith(".png") else "image/jpeg"
            with open(path, "rb") as f:
                b64 = base64.b64encode(f.read()).decode()
            parts.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{b64}"}})
            return parts
        lo, hi = time_range if time_range else (0.0, float(asset.duration or 0.0))
        if tool in ("frame_confirm", "clip_grounding"):
            if asset.type != "video":
                raise PerceptionError(f"{tool} needs a video; asset {asset.id} is {asset.type}")
            frames = extract_frames(path, sample_times(lo, hi, self.frames_per_range))
            if not frames:
                raise PerceptionError(f"no frames decoded from {asset.id} in [{lo}, {hi}]")
            for t, jpg in frames:
                parts.append({"type": "text", "text": f"Frame at t={t:.2f}s"})
                parts.append(
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(jpg).decode()},
                    }
                )
        else:
            wav = extract_audio_wav(path, lo, hi)
            parts.append({"type": "text", "text": f"Audio from t={lo:.2f}s to t={hi:.2f}s"})
            parts.append(
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
            )
        return parts

    async def describe(self, asset: AssetSpec, tool: str, query: str, time_range: tuple[float, float] | None) -> str:
        content = self.build_content(asset, tool, query, time_range)
        if self._client is None:
            self._client = ChatClient(self.endpoint)
        try:
            resp = await self._client.chat([{"role": "user", "content": content}])
        except ChatError as e:  # already redacted; its usage (retries, faults) still counts
            self.usage.add(e.usage)
            raise PerceptionError(f"perception endpoint error: {e}") from None
        self.usage.add(resp.usage)
        text = resp.text.strip()
        if not text:
            raise PerceptionError("perception endpoint returned an empty reply")
        return text

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
