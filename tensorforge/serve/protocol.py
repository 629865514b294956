"""The KServe v2 / Open Inference Protocol tensors: JSON bodies and the binary-data extension.

A request is a JSON object, or (binary extension) a JSON header of `Inference-Header-Content-Length` bytes
followed by the raw tensors, in the order of the inputs that declare `parameters.binary_data_size`. Responses
mirror that: outputs asked for with `parameters.binary_data` (or all, with the request parameter
`binary_data_output`) are sent raw after the JSON header. Every problem is a `ProtocolError` with the HTTP
status it deserves and a message naming the tensor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

HEADER_LENGTH = "inference-header-content-length"

DATATYPES = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}  # fmt: skip
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}


class ProtocolError(Exception):
    """A request the protocol cannot accept: `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def datatype_of(dtype: np.dtype) -> str:
    name = _NAMES.get(np.dtype(dtype))
    if name is None:
        raise ProtocolError(f"tensors of numpy type {dtype} have no KServe datatype", 500)
    return name


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    binary_outputs: set[str]
    requested: list[str] | None  # output names asked for (None: all)
    binary_all: bool


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    """Parse an infer request body (JSON, or JSON + binary tensors)."""
    if header_length is not None:
        try:
            split = int(header_length)
        except ValueError:
            raise ProtocolError(f"{HEADER_LENGTH} must be an integer, got {header_length!r}") from None
        if not 0 <= split <= len(body):
            raise ProtocolError(f"{HEADER_LENGTH} is {split}, but the body has {len(body)} bytes")
        header, binary = body[:split], body[split:]
    else:
        header, binary = body, b""
    try:
        data = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ProtocolError(f"the request body is not valid JSON: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), list) or not data["inputs"]:
        raise ProtocolError('the request must be a JSON object with a non-empty "inputs" list')
    inputs, offset = {}, 0
    for index, item in enumerate(data["inputs"]):
        array, used = _decode_tensor(item, index, binary, offset)
        if array.dtype.kind == "O":
            raise ProtocolError(f"input {item.get('name')!r}: BYTES tensors are not supported")
        if item["name"] in inputs:
            raise ProtocolError(f"input {item['name']!r} is given twice")
        inputs[item["name"]] = array
        offset += used
    if offset != len(binary):
        raise ProtocolError(f"{len(binary) - offset} bytes of binary data follow the tensors and belong to none")
    outputs = data.get("outputs")
    if outputs is not None and not (
        isinstance(outputs, list) and all(isinstance(o, dict) and "name" in o for o in outputs)
    ):
        raise ProtocolError('"outputs" must be a list of objects with a "name"')
    parameters = data.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ProtocolError('"parameters" must be an object')
    binary_outputs = {o["name"] for o in outputs or [] if (o.get("parameters") or {}).get("binary_data")}
    request_id = data.get("id")
    return InferRequest(
        id=None if request_id is None else str(request_id),
        inputs=inputs,
        binary_outputs=binary_outputs,
        requested=None if outputs is None else [o["name"] for o in outputs],
        binary_all=bool(parameters.get("binary_data_output", False)),
    )


def _decode_tensor(item: Any, index: int, binary: bytes, offset: int) -> tuple[np.ndarray, int]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ProtocolError(f'input {index} must be an object with a "name"')
    name = item["name"]
    datatype, shape = item.get("datatype"), item.get("shape")
    if datatype not in DATATYPES:
        raise ProtocolError(f"input {name!r}: datatype {datatype!r} is not one of {sorted(DATATYPES)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ProtocolError(f"input {name!r}: shape must be a list of non-negative integers, got {shape!r}")
    dtype = DATATYPES[datatype]
    count = int(np.prod(shape, dtype=np.int64))
    size = (item.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if size != count * dtype.itemsize:
            raise ProtocolError(f"input {name!r}: binary_data_size {size} != {count} elements × {dtype.itemsize} bytes")
        if offset + size > len(binary):
            raise ProtocolError(f"input {name!r}: the binary data ends {offset + size - len(binary)} bytes early")
        return np.frombuffer(binary, dtype=dtype, count=count, offset=offset).reshape(shape).copy(), size
    if "data" not in item:
        raise ProtocolError(f'input {name!r} has neither "data" nor binary_data_size')
    try:
        array = np.asarray(item["data"], dtype=dtype)
    except (TypeError, ValueError, OverflowError) as err:
        raise ProtocolError(f"input {name!r}: data is not {datatype}: {err}") from None
    if array.size != count:
        raise ProtocolError(f"input {name!r}: {array.size} values for shape {shape} ({count} elements)")
    return array.reshape(shape), 0


def encode_response(
    model: str, request: InferRequest, outputs: Mapping[str, np.ndarray], order: Sequence[str]
) -> tuple[bytes, dict[str, str]]:
    """The response body and its extra headers (the JSON length, when binary tensors follow)."""
    names = order if request.requested is None else request.requested
    unknown = [name for name in names if name not in outputs]
    if unknown:
        raise ProtocolError(f"outputs {unknown} were asked for; the model has {list(order)}")
    items, blobs = [], []
    for name in names:
        array = np.ascontiguousarray(outputs[name])
        item: dict[str, Any] = {"name": name, "datatype": datatype_of(array.dtype), "shape": list(array.shape)}
        if request.binary_all or name in request.binary_outputs:
            raw = array.tobytes()
            item["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            item["data"] = array.reshape(-1).tolist()
        items.append(item)
    body: dict[str, Any] = {"model_name": model, "outputs": items}
    if request.id is not None:
        body["id"] = request.id
    header = json.dumps(body).encode()
    if not blobs:
        return header, {}
    return header + b"".join(blobs), {HEADER_LENGTH: str(len(header))}
