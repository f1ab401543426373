"""What never changes about a simulated ad: the vocabulary its titles and keywords come from, and its
product, campaign and base title, stable per ``(seed, ad)`` (:mod:`freshidx.tools.generator` writes
the changes of these ads)."""

from __future__ import annotations

import functools
import hashlib
import random
from typing import NamedTuple

# Fixed, so titles and keywords look like real ads and searches have something to hit.
BRANDS: tuple[str, ...] = (
    "acme", "aurora", "bolt", "cascade", "cobalt", "crestline", "driftwood", "ember", "evergreen",
    "falcon", "fjord", "granite", "harbor", "helix", "horizon", "ironwood", "juniper", "kestrel",
    "lumen", "maple", "meridian", "monarch", "nimbus", "northwind", "oakridge", "onyx", "orbit",
    "pioneer", "quartz", "redwood", "sable", "sierra", "solstice", "summit", "tundra", "vertex",
    "willow", "zenith", "zephyr", "atlas",
)

NOUNS: tuple[str, ...] = (
    "backpack", "blender", "boots", "camera", "chair", "charger", "coffee", "cookware", "desk",
    "drone", "earbuds", "headphones", "helmet", "jacket", "kettle", "keyboard", "lamp", "laptop",
    "mattress", "microphone", "monitor", "mouse", "notebook", "pillow", "printer", "projector",
    "router", "sandals", "scooter", "sneakers", "sofa", "speaker", "sunglasses", "tablet", "tent",
    "toaster", "treadmill", "umbrella", "vacuum", "watch", "bicycle", "blanket", "bottle", "cooler",
    "grill", "hoodie", "luggage", "mixer", "phone", "rug", "skillet", "socks", "stroller", "suitcase",
    "thermostat", "tripod", "wallet", "webcam", "yoga-mat", "jeans",
)

ADJECTIVES: tuple[str, ...] = (
    "affordable", "compact", "cozy", "deluxe", "durable", "eco", "elegant", "ergonomic", "essential",
    "fast", "foldable", "heavy-duty", "lightweight", "luxury", "modern", "portable", "premium", "pro",
    "quiet", "rechargeable", "rugged", "sleek", "smart", "soft", "sturdy", "ultra", "vintage",
    "waterproof", "wireless", "classic", "adjustable", "breathable", "cordless", "insulated",
    "minimalist", "noise-cancelling", "organic", "padded", "stainless", "versatile", "handmade",
    "slim", "bright", "warm", "cool", "quick-dry", "non-stick", "energy-saving", "high-speed",
    "travel", "outdoor", "indoor", "kids", "family", "everyday", "limited", "new", "best-selling",
    "refurbished", "professional",
)

QUALIFIERS: tuple[str, ...] = (
    "black", "white", "silver", "blue", "red", "green", "grey", "navy", "olive", "beige", "walnut",
    "bamboo", "leather", "cotton", "wool", "steel", "aluminum", "carbon", "ceramic", "glass",
    "small", "medium", "large", "xl", "mini", "max", "plus", "lite", "2-pack", "set",
    "bundle", "edition", "series", "v2", "gen3", "4k", "usb-c", "bluetooth", "5g", "hd",
)

VOCABULARY: tuple[str, ...] = BRANDS + NOUNS + ADJECTIVES + QUALIFIERS


def _stable_int(*parts: object) -> int:
    """A process-independent hash (Python's ``hash`` of str is salted per process)."""
    digest = hashlib.blake2b(":".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ad_id(i: int) -> str:
    return f"ad-{i:06d}"


class AdProfile(NamedTuple):
    """What never changes about an ad (for a given seed): its product, campaign and base title."""

    product: int
    campaign: int
    brand: str
    noun: str
    qualifier: str
    base_title: str


@functools.lru_cache(maxsize=1 << 16)
def stable_profile(seed: int, products: int, campaigns: int, ad: int) -> AdProfile:
    """Ad number ``ad``'s profile under ``seed`` among ``products`` products and ``campaigns`` campaigns."""
    product = _stable_int(seed, "product-of", ad) % products
    campaign = _stable_int(seed, "campaign-of", ad) % campaigns
    h = _stable_int(seed, "product", product)
    brand = BRANDS[h % len(BRANDS)]
    noun = NOUNS[(h >> 16) % len(NOUNS)]
    qualifier = QUALIFIERS[(h >> 32) % len(QUALIFIERS)]
    title = random_title(random.Random(f"{seed}:title:{ad}"), brand, noun, qualifier)
    return AdProfile(product, campaign, brand, noun, qualifier, title)


def random_title(rng: random.Random, brand: str, noun: str, qualifier: str) -> str:
    """One to three adjectives, the brand and the noun, and sometimes qualifiers."""
    adjectives = rng.sample(ADJECTIVES, rng.randint(1, 3))
    words = [*adjectives, brand, noun]
    if rng.random() < 0.6:
        words.append(qualifier)
    if rng.random() < 0.3:
        words.append(rng.choice(QUALIFIERS))
    return " ".join(words)
