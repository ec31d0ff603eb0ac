"""A `video.<field>=` override over a preset wins over the preset's other way to give the same thing (seconds vs
frames), and the plan names the overrides beside the preset (h3plan.planning.request.video_overrides /
request_label)."""

import pytest

from h3plan import ConfigError, resolve_config
from h3plan.planning.request import request_label, video_overrides


def test_video_overrides_null_the_other_length_field():
    assert video_overrides(["hardware=sm90"]) == ["hardware=sm90"]
    assert video_overrides(["video.seconds=10"]) == ["video.seconds=10", "video.frames=null",
                                                     "video.overrides=[seconds]"]
    assert video_overrides(["+video.frames=130", "video.height=704"]) == [
        "+video.frames=130", "video.height=704", "video.seconds=null", "video.overrides=[frames,height]"]
    # both given: the user's own pair, checked for agreement as before
    assert video_overrides(["video.seconds=10", "video.frames=243"])[-1] == "video.overrides=[seconds,frames]"
    assert "video.frames=null" not in video_overrides(["video.seconds=10", "video.frames=243"])
    assert video_overrides(["video=t2v_544x960_5s", "video.name=x"]) == ["video=t2v_544x960_5s", "video.name=x"]


def test_request_label():
    assert request_label({"name": "t2v_768x1344_5s"}) == "video=t2v_768x1344_5s"
    assert request_label({"name": "p", "seconds": 10.0, "audio": False, "overrides": ["seconds", "audio"]}) == \
        "video=p with video.seconds=10 video.audio=false"


def test_seconds_over_a_frames_preset():
    """The README's example: the default preset gives frames=124; video.seconds=10 wins (243 frames)."""
    p = resolve_config(**{"video.height": 704, "video.seconds": 10})
    seq = p.derived_value("sequence")
    assert (seq["height"], seq["width"], seq["frames"]) == (704, 1344, 243)
    assert seq["source"] == "video=t2v_768x1344_5s with video.height=704 video.seconds=10"
    assert p.get("video")["frames"] is None


def test_frames_over_a_seconds_preset():
    p = resolve_config(video="t2v_544x960_5s", **{"video.frames": 130})
    seq = p.derived_value("sequence")
    assert seq["frames"] == 141 and seq["source"] == "video=t2v_544x960_5s with video.frames=130"


def test_both_set_must_agree():
    with pytest.raises(ConfigError, match="video.frames=124: disagrees with video.seconds=10.0"):
        resolve_config(**{"video.seconds": 10, "video.frames": 124})


def test_off_grid_height_names_the_nearest_and_the_fix():
    with pytest.raises(ConfigError) as e:
        resolve_config(**{"video.height": 720, "video.seconds": 10})
    assert "nearest: 704 or 736" in str(e.value) and e.value.fix == {"video.height": "704"}
