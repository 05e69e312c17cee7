"""What the decision-vision tests share: sample images as the converter draws them, data URLs, and the
questions a body asks about a picture."""

from __future__ import annotations

import base64
import io
from typing import Any


def png_url(image: Any, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    mime = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}[fmt]
    return f"data:{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def sample_image(height: int, width: int, seed: int) -> Any:
    from converters.decision_vision.verify import verify_image

    return verify_image(height, width, seed)


def png_b64(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


BODY_QUESTIONS = {
    "colour": {"type": "choice", "instructions": "Which colour dominates?",
               "criteria": {"red": "mostly red", "green": "mostly green", "blue": "mostly blue"}},
    "busy": {"type": "noul", "instructions": "Is the picture busy?"},
    "quality": {"type": "score", "instructions": "How sharp is it?", "levels": ["blurry", "fair", "sharp", "crisp"]},
}
