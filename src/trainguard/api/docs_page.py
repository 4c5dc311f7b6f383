"""``/v1/docs``: the API's interactive documentation, served entirely by this process.

Swagger UI's files (a Swagger UI 5 release, which reads OpenAPI 3.1) come from the
``fastapi-offline`` package's ``static`` folder and are mounted under
``/v1/docs/assets``; the page and its start-up script
are ours, so the page works on a machine without internet access and its
Content-Security-Policy allows only this origin's scripts (no inline script, no CDN).
"""

from __future__ import annotations

import json
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

DOCS_PATH = "/v1/docs"
ASSETS_PATH = f"{DOCS_PATH}/assets"
INIT_PATH = f"{DOCS_PATH}/init.js"

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title} - API</title>
<link rel="stylesheet" href="{assets}/swagger-ui.css">
<link rel="icon" type="image/png" href="{assets}/favicon.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script src="{init}"></script>
</body>
</html>
"""

# Swagger UI keeps the bearer token a user enters in "Authorize" for the page's
# requests ("Try it out"); nothing is persisted in the browser.
_INIT = """window.addEventListener("load", function () {{
  window.ui = SwaggerUIBundle({{
    url: {openapi},
    dom_id: "#swagger-ui",
    deepLinking: true,
    persistAuthorization: false,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  }});
}});
"""


def mount_docs(app: FastAPI, openapi_url: str) -> None:
    """Serve the documentation page, its start-up script and Swagger UI's files."""
    page = _PAGE.format(title=app.title, assets=ASSETS_PATH, init=INIT_PATH)
    init = _INIT.format(openapi=json.dumps(openapi_url))
    app.mount(
        ASSETS_PATH,
        StaticFiles(directory=str(resources.files("fastapi_offline") / "static")),
        name="docs-assets",
    )

    @app.get(DOCS_PATH, include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get(INIT_PATH, include_in_schema=False)
    async def docs_init() -> Response:
        return Response(init, media_type="application/javascript")


__all__ = ["ASSETS_PATH", "DOCS_PATH", "mount_docs"]
