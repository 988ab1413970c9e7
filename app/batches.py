"""The OpenAI Batch API: /v1/files and /v1/batches, as OpenAI answers them (errors in OpenAI's
shape). A thin skin over tailguard.batches: the lines run on the batch lane, fed by the batch
feeder (tailguard/batches/feeder.py), each through the same path as a synchronous request.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g, jsonify, request

from app.body import json_body
from app.gateway_ext import get_batches
from tailguard import settings
from tailguard.errors import InvalidField

bp = Blueprint("batches", __name__, url_prefix="/v1")

#: room for the multipart framing and the purpose field around the file itself
MULTIPART_SLACK_BYTES = 64 * 1024


@bp.post("/files")
def upload():
    """Upload a JSONL file of batch requests (multipart: file, purpose=batch).
    ---
    post:
      summary: Upload a file (OpenAI)
      requestBody: {required: true, content: {multipart/form-data: {schema: {type: object}}}}
      responses:
        200: {description: the file, content: {application/json: {schema: {type: object}}}}
    """
    # this route alone takes bodies up to a batch file's size (Flask's per-request bound)
    request.max_content_length = (settings.BATCH_MAX_FILE_BYTES.get(current_app.config)
                                  + MULTIPART_SLACK_BYTES)
    upload = request.files.get("file")
    if upload is None:
        raise InvalidField("send the file as the multipart field 'file'", field="file")
    purpose = request.form.get("purpose", "")
    # werkzeug spools a large part to a temporary file: the file is copied from it in chunks
    return jsonify(get_batches().upload(upload.filename or "", purpose, upload.stream,
                                        g.get("api_key")))


@bp.get("/files")
def list_files():
    """Files of the caller's key, newest first (cursor: after, limit; purpose).
    ---
    get:
      summary: List files (OpenAI)
      responses:
        200: {description: a page of files, content: {application/json: {schema: {type: object}}}}
        400: OpenAI400
    """
    return jsonify(get_batches().files(g.get("api_key"), request.args.get("after"),
                                       request.args.get("limit"), request.args.get("purpose")))


@bp.get("/files/<file_id>")
def get_file(file_id: str):
    """A file's object.
    ---
    get:
      summary: Retrieve a file (OpenAI)
      responses:
        200: {description: the file, content: {application/json: {schema: {type: object}}}}
        404: OpenAI404
    """
    return jsonify(get_batches().file(file_id, g.get("api_key")))


@bp.delete("/files/<file_id>")
def delete_file(file_id: str):
    """Delete a file (its contents too); not the input of a batch that has not ended (409).
    ---
    delete:
      summary: Delete a file (OpenAI)
      responses:
        200: {description: "{id, object, deleted}", content: {application/json: {schema: {type: object}}}}
        404: OpenAI404
        409: OpenAI409
    """
    return jsonify(get_batches().delete_file(file_id, g.get("api_key")))


@bp.get("/files/<file_id>/content")
def file_content(file_id: str):
    """A file's contents, as uploaded or written.
    ---
    get:
      summary: Retrieve a file's contents (OpenAI)
      responses:
        200: {description: the bytes, content: {application/octet-stream: {schema: {type: string}}}}
        404: OpenAI404
    """
    return Response(get_batches().content(file_id, g.get("api_key")),
                    mimetype="application/octet-stream")


@bp.post("/batches")
def create_batch():
    """Create a batch of an uploaded file's requests (input_file_id, endpoint,
    completion_window=24h, metadata).
    ---
    post:
      summary: Create a batch (OpenAI)
      requestBody: {required: true, content: {application/json: {schema: {type: object}}}}
      responses:
        200: {description: the batch, content: {application/json: {schema: {type: object}}}}
    """
    return jsonify(get_batches().create(json_body(), g.get("api_key")))


@bp.get("/batches")
def list_batches():
    """Batches of the caller's key, newest first (cursor: after, limit).
    ---
    get:
      summary: List batches (OpenAI)
      responses:
        200: {description: a page of batches, content: {application/json: {schema: {type: object}}}}
        400: OpenAI400
    """
    return jsonify(get_batches().batches(g.get("api_key"), request.args.get("after"),
                                         request.args.get("limit")))


@bp.get("/batches/<batch_id>")
def get_batch(batch_id: str):
    """A batch's object.
    ---
    get:
      summary: Retrieve a batch (OpenAI)
      responses:
        200: {description: the batch, content: {application/json: {schema: {type: object}}}}
        404: OpenAI404
    """
    return jsonify(get_batches().batch(batch_id, g.get("api_key")))


@bp.post("/batches/<batch_id>/cancel")
def cancel_batch(batch_id: str):
    """Cancel a batch: nothing more is queued; it ends cancelled once its running lines end.
    ---
    post:
      summary: Cancel a batch (OpenAI)
      responses:
        200: {description: the batch, content: {application/json: {schema: {type: object}}}}
        404: OpenAI404
        409: OpenAI409
    """
    return jsonify(get_batches().cancel(batch_id, g.get("api_key")))
