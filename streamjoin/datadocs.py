"""Great Expectations' Data Docs, readable offline: the styles and scripts its pages load from public
CDNs, fetched once by set-up (`streamjoin setup-docs-assets`) from npm and served from the site.

Great Expectations writes its pages with links to Bootstrap, jQuery, bootstrap-table, Font Awesome
and Vega on CDNs; without the web the index is empty (its table is filled by bootstrap-table) and
every page unstyled. After each build, `localize` copies the fetched files into the site
(`static/vendor/`) and points the pages' links at them, relative to each page, so the site works
offline and can be moved or served as a folder. The files are pinned by version and by hash.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from streamjoin.atomic import replace_file
from streamjoin.errors import SetupError
from streamjoin.jars import checkout

REGISTRY = "https://registry.npmjs.org"
VENDOR = "static/vendor"  # inside a Data Docs site


@dataclass(frozen=True)
class Asset:
    """One file of an npm package, and the CDN address Great Expectations' pages load it from."""

    url: str
    package: str
    version: str
    path: str  # inside the package
    sha256: str

    @property
    def local(self) -> str:
        """Where it is kept: <package>@<version>/<path> (also under a site's static/vendor/)."""
        return f"{self.package}@{self.version}/{self.path}"


def _asset(url: str, package: str, path: str, sha256: str) -> Asset:
    name, version = package.rsplit("@", 1)
    return Asset(url, name, version, path, sha256)


ASSETS = (
    _asset(
        "https://code.jquery.com/jquery-3.7.1.min.js",
        "jquery@3.7.1",
        "dist/jquery.min.js",
        "fc9a93dd241f6b045cbff0481cf4e1901becd0e12fb45166a8f17f95823f0b1a",
    ),
    _asset(
        "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js",
        "popper.js@1.12.9",
        "dist/umd/popper.min.js",
        "a52f7aa54d7bcaafa056ee0a050262dfc5694ae28dee8b4cac3429af37ff0d66",
    ),
    _asset(
        "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js",
        "bootstrap@4.3.1",
        "dist/js/bootstrap.min.js",
        "0a34a87842c539c1f4feec56bba982fd596b73500046a6e6fe38a22260c6577b",
    ),
    _asset(
        "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css",
        "bootstrap@4.3.1",
        "dist/css/bootstrap.min.css",
        "60b19e5da6a9234ff9220668a5ec1125c157a268513256188ee80f2d2c8d8d36",
    ),
    _asset(
        "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js",
        "bootstrap-table@1.19.1",
        "dist/bootstrap-table.min.js",
        "06a571a9beb50bd5ddd60517159775dfec1f3e798fff38fb117ae2350dc9ba9d",
    ),
    _asset(
        "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css",
        "bootstrap-table@1.19.1",
        "dist/bootstrap-table.min.css",
        "643f536f6982af4d7287af23f89ad457dd7e4a82f9c695330a112b0881c30a4a",
    ),
    _asset(
        "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
        "bootstrap-table@1.19.1",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
        "111f68d31d1bdd714f9503bf5f4e162e0739c363e4ff2feef950d39e78266ffc",
    ),
    _asset(
        "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
        "bootstrap-table@1.19.0",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
        "2c707bb54520737762a76f2238e87627993fb63bcef6d789a21a4957f393fa1c",
    ),
    _asset(
        "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css",
        "bootstrap-table@1.19.0",
        "dist/extensions/filter-control/bootstrap-table-filter-control.css",
        "b3ff051168696ec9ae3cf8616c59a6db8734fb282863b23edfd8c0f93eb5c4f0",
    ),
    _asset(
        "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js",
        "bootstrap-datepicker@1.9.0",
        "dist/js/bootstrap-datepicker.min.js",
        "6ea55ea86749ee1fe560fabac6b3effd81b33046fa74dc657e24d41d28110a9f",
    ),
    _asset(
        "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css",
        "bootstrap-datepicker@1.9.0",
        "dist/css/bootstrap-datepicker.min.css",
        "b22c8ea45fe905650f8087108b5ed32c1923bcd80d400adc9b0241f18be40208",
    ),
    _asset(
        "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css",
        "@forevolve/bootstrap-dark@1.1.0",
        "dist/css/bootstrap-prefers-dark.css",
        "b087541364cdc7e95cbf71be42da5259f3d11431cc84198c17b47cd44c87cd5b",
    ),
    _asset(
        "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css",
        "@fortawesome/fontawesome-free@6.6.0",
        "css/all.min.css",
        "e5e202e3c899507992952533f57b634722b69b34241d271963559d31aa33ef81",
    ),
    # jsDelivr answers `npm/<package>@<major>` with the newest release's `jsdelivr` file: pinned here
    _asset(
        "https://cdn.jsdelivr.net/npm/vega@5",
        "vega@5.33.1",
        "build/vega.min.js",
        "463f3db6a40b20e9747b4ed38f37ed0add508838f9141b1cf8366784b07b30c8",
    ),
    _asset(
        "https://cdn.jsdelivr.net/npm/vega-lite@5",
        "vega-lite@5.23.0",
        "build/vega-lite.min.js",
        "58c27358e26f2d319cf62f45bc17a4c8362f08645001df2ec8d341eee4097c7f",
    ),
    _asset(
        "https://cdn.jsdelivr.net/npm/vega-embed@6",
        "vega-embed@6.29.0",
        "build/vega-embed.min.js",
        "12d02acfbe3ec59ef9a37dd4822a2e04e2961b5bbb671bbe661d2221715b99da",
    ),
)
# Font Awesome's stylesheet loads its fonts from ../webfonts/, relative to itself.
FONTS = ("@fortawesome/fontawesome-free@6.6.0", "webfonts/")
# Great Expectations' logo, from its web assets; the site holds the same images in static/images/.
_WEB_IMAGES = re.compile(
    r'"https://great-expectations-web-assets\.s3\.[a-z0-9-]+\.amazonaws\.com/([\w.-]+)(?:\?[^"]*)?"'
)
_CHECKS_OF_CDN = re.compile(r'\s+(?:integrity|crossorigin)="[^"]*"')  # hashes of the CDN's copies


def folder() -> Path:
    """Where the fetched files are kept: $STREAMJOIN_DOCS_ASSETS; else <checkout>/.docs-assets in
    a source checkout (what infra/setup.sh fills); else ~/.cache/streamjoin/docs-assets."""
    if os.environ.get("STREAMJOIN_DOCS_ASSETS"):
        return Path(os.environ["STREAMJOIN_DOCS_ASSETS"])
    root = checkout()
    return root / ".docs-assets" if root else Path.home() / ".cache" / "streamjoin" / "docs-assets"


def fetched(where: Path | None = None) -> bool:
    """Whether every pinned file is in `where` (default `folder()`) with its hash."""
    where = where or folder()
    return all(_matches(where / a.local, a.sha256) for a in ASSETS) and _has_fonts(where)


def _has_fonts(where: Path) -> bool:
    return any((where / FONTS[0] / FONTS[1]).glob("*.woff2"))


def fetch(where: Path | None = None) -> Path:
    """Fetch the pinned files from npm's registry into `where` (default `folder()`), once: files
    already there with their hash are kept. Refuses, naming the file, one whose hash differs."""
    where = where or folder()
    packages = sorted({(a.package, a.version) for a in ASSETS})
    for package, version in packages:
        wanted = [a for a in ASSETS if (a.package, a.version) == (package, version)]
        fonts = f"{package}@{version}" == FONTS[0]
        if all(_matches(where / a.local, a.sha256) for a in wanted) and (not fonts or _has_fonts(where)):
            continue
        archive = _download(package, version)
        for asset in wanted:
            data = _member(archive, asset.path, f"{package}@{version}")
            if hashlib.sha256(data).hexdigest() != asset.sha256:
                raise SetupError(
                    f"{package}@{version}/{asset.path} from {REGISTRY} does not have the pinned hash; "
                    "the registry served another file than the one streamjoin was checked with: do not use it"
                )
            replace_file(where / asset.local, data)
        if fonts:
            _extract_folder(archive, FONTS[1], where / FONTS[0])
    return where


def _download(package: str, version: str) -> tarfile.TarFile:
    """The package's tarball, from npm's registry once, then from ~/.cache/streamjoin/npm (as Maven
    keeps its local repository: a second set-up, a fresh clone's included, needs no network)."""
    name = package.rsplit("/", 1)[-1]
    kept = Path.home() / ".cache" / "streamjoin" / "npm" / f"{package.replace('/', '+')}-{version}.tgz"
    if not kept.is_file():
        url = f"{REGISTRY}/{package}/-/{name}-{version}.tgz"
        try:
            with urllib.request.urlopen(url, timeout=60) as answer:
                replace_file(kept, answer.read())
        except OSError as exc:
            raise SetupError(
                f"could not fetch {url}: {exc}; check the network and run set-up again"
            ) from None
    return tarfile.open(kept, mode="r:gz")


def _member(archive: tarfile.TarFile, path: str, package: str) -> bytes:
    member = archive.extractfile(f"package/{path}")
    if member is None:
        raise SetupError(f"{package} has no file {path}")
    return member.read()


def _extract_folder(archive: tarfile.TarFile, prefix: str, into: Path) -> None:
    for member in archive.getmembers():
        relative = member.name.removeprefix("package/")
        if member.isfile() and relative.startswith(prefix) and ".." not in relative:
            data = archive.extractfile(member)
            assert data is not None  # a regular file
            replace_file(into / relative, data.read())


def _matches(path: Path, sha256: str) -> bool:
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256


def localize(site: str | Path, pages: list[Path]) -> bool:
    """Point `pages` of the Data Docs `site` at the site's own copies of the CDN files (copied
    there once). False, with the pages left as they are, when set-up has not fetched them."""
    source, site = folder(), Path(site)
    if not fetched(source):
        return False
    vendor = site / VENDOR
    if not fetched(vendor):
        shutil.copytree(source, vendor, dirs_exist_ok=True)
    for page in pages:
        text = page.read_text()
        images = os.path.relpath(site / "static" / "images", page.parent)
        changed = _WEB_IMAGES.sub(f'"{images}/\\1"', _pointed_at(text, os.path.relpath(vendor, page.parent)))
        if changed != text:
            replace_file(page, changed)
    return True


def _pointed_at(html: str, vendor: str) -> str:
    """`html` with each CDN address replaced by the copy under `vendor` (a relative path), and the
    CDN copies' integrity hashes on those tags dropped (the copies are checked at fetch instead)."""
    for asset in ASSETS:
        local = f"{vendor}/{asset.local}".replace(os.sep, "/")
        tag = re.compile(r"<(?:script|link)\b[^>]*?\"" + re.escape(asset.url) + r'"[^>]*>')
        html = tag.sub(partial(_repointed, url=asset.url, local=local), html)
    return html


def _repointed(tag: re.Match[str], url: str, local: str) -> str:
    return _CHECKS_OF_CDN.sub("", tag.group(0)).replace(f'"{url}"', f'"{local}"')
