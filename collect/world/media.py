"""Media assets as annotation tracks: filler tracks, the anchor placed inside a time window, video assets."""

from __future__ import annotations

from collect.tasks import GoldNeed, Tracks
from collect.world.entities import Entity, Gen
from collect.world.vocab import AUDIO_FILLER, FILLER, FRAME_FILLER, KINDS, a_an


def base_tracks(g: Gen, kind: str, duration: float, decoys: list[str]) -> dict:
    """Filler subtitles, audio, clips and frames over the whole duration; decoy names appear late in the video."""
    rng = g.rng
    scene = KINDS[kind]["scene"]
    tr = new_tracks()
    t = 2.0
    while t < duration - 6:
        text = rng.choice(FILLER).format(scene=scene)
        tr["subtitles"].append({"start": t, "end": t + 4.0, "text": text})
        t += rng.choice([8.0, 10.0, 12.0])
    for j in range(int(duration // 30) + 1):
        s = min(duration - 4, 5.0 + 30 * j + rng.randrange(0, 10))
        kind_a, text = rng.choice(AUDIO_FILLER)
        tr["audio"].append({"start": s, "end": s + 4.0, "kind": kind_a, "text": text})
    for j in range(int(duration // 40) + 1):
        s = 40.0 * j
        tr["clips"].append(
            {
                "start": s,
                "end": min(duration, s + 40.0),
                "caption": f"The camera explores {scene}; " + rng.choice(FRAME_FILLER).format(scene=scene).lower(),
            }
        )
        tr["frames"].append({"t": s + 3.0, "description": rng.choice(FRAME_FILLER).format(scene=scene), "ocr": ""})
    for j, d in enumerate(decoys):
        tt = duration - 20.0 + 6 * j
        tr["subtitles"].append({"start": tt, "end": tt + 4.0, "text": f"Later the guide compares it with {d}."})
    return tr


def new_tracks(**kw) -> dict:
    return {"subtitles": [], "audio": [], "clips": [], "frames": [], **kw}


def sort_tracks(tr: dict) -> Tracks:
    data = {k: list(v) for k, v in tr.items()}
    for key in ("subtitles", "audio", "clips"):
        data[key].sort(key=lambda x: (x["start"], x.get("text", x.get("caption", ""))))
    data["frames"].sort(key=lambda x: (x["t"], x["description"]))
    return Tracks.model_validate(data)


def placeanchor_need(g: Gen, tr: dict, e: Entity, source: str, window: tuple[float, float]) -> None:
    """Put the entity's name into one track inside the window."""
    k = KINDS[e.kind]
    t = window[0] + 3.0
    # clear filler in the window so the anchor is the only named thing there
    tr["subtitles"] = [s for s in tr["subtitles"] if not (window[0] - 4 <= s["start"] <= window[1])]
    if source == "subtitle":
        tr["subtitles"].append(
            {
                "start": t,
                "end": t + 5.0,
                "text": g.rng.choice(
                    [
                        f"And here we are at {e.name}, right in the middle of {k['scene']}.",
                        f"Our next stop is {e.name}, which locals will tell you about for hours.",
                        f"This is {e.name}; the {k['leader']} kindly agreed to show us around.",
                    ]
                ),
            }
        )
    elif source == "visual":
        tr["frames"].append(
            {
                "t": t,
                "description": f"A painted sign at {k['scene']} shows the name of the {k['noun']}.",
                "ocr": e.name.upper(),
            }
        )
    else:
        tr["audio"].append(
            {
                "start": t,
                "end": t + 5.0,
                "kind": "speech",
                "text": f"Announcer: Welcome, everyone, to {e.name}. Please keep to the marked paths.",
            }
        )


def fmt_window(w: tuple[float, float]) -> str:
    return f"between {int(w[0])} s and {int(w[1])} s"


def video_asset(g: Gen, aid: str, kind: str, decoys: list[str], dur: float | None = None) -> dict:
    """A video asset as a plain dict (validated into AssetSpec once the task is complete)."""
    dur = dur or float(g.rng.choice([90, 120, 150, 180, 240]))
    return {
        "id": aid,
        "type": "video",
        "duration": dur,
        "path": f"embedded/{aid}.mp4",
        "tracks": base_tracks(g, kind, dur, decoys),
    }


def anchor_need(g: Gen, e: Entity, asset: dict, source: str, timed: bool) -> tuple[GoldNeed, str]:
    """Place the anchor; returns (anchor need, question phrase that points at it)."""
    k = KINDS[e.kind]
    start = float(g.rng.randrange(10, int(asset["duration"]) - 60, 5))
    win = (start, start + 15.0)
    placeanchor_need(g, asset["tracks"], e, source, win)
    where = {"subtitle": "the narrator names", "visual": "a sign shows the name of", "audio": "an announcer names"}
    if timed or source != "visual":
        phrase = f"{fmt_window(win)} of {asset['id']}, {where[source]} {a_an(k['noun'])}"
        focus = f"name of the {k['noun']} {fmt_window(win)}"
    else:
        phrase = f"in {asset['id']}, a sign shows the name of {a_an(k['noun'])}"
        focus = f"sign with the name of the {k['noun']}"
    return GoldNeed(
        need=f"identify the {k['noun']} named in {asset['id']}",
        need_role="anchor",
        preferred_source=source,
        query_focus=focus,
        gold_value=e.name,
    ), phrase
