"""Real models with real weights on real inputs, against ONNX Runtime (relative error ≤ 1e-4)."""

import numpy as np
import pytest

from tensorforge import load_onnx
from tensorforge import realdata as rd
from tensorforge.ops import Executor
from tests.helpers import DEVICES, relative_error, run_onnxruntime

pytest.importorskip("onnxruntime")
REL_TOL = 1e-4


@pytest.fixture(scope="module", params=DEVICES)
def orientation(request):
    path = rd.orientation_model()
    return str(path), Executor(load_onnx(path), request.param)


def test_orientation_classifier_matches_onnxruntime_and_labels(orientation):
    path, executor = orientation
    images = rd.rotated_pages()
    assert len(images) == 16
    ours_correct = theirs_correct = 0
    for item in images:
        x = rd.orientation_input(item.image)
        ours = executor.run({"x": x})["fetch_name_0"].cpu().numpy()
        theirs = run_onnxruntime(path, {"x": x})["fetch_name_0"]
        assert relative_error(ours, theirs) <= REL_TOL, item.name
        assert ours.argmax() == theirs.argmax(), item.name
        label_index = rd.ORIENTATION_LABELS.index(item.label)
        ours_correct += int(ours.argmax() == label_index)
        theirs_correct += int(theirs.argmax() == label_index)
    assert ours_correct == theirs_correct
    # The three page images are real documents: every rotation of them is recognised.
    pages = [i for i in images if i.name.startswith("page")]
    assert all(
        executor.run({"x": rd.orientation_input(i.image)})["fetch_name_0"].cpu().numpy().argmax()
        == rd.ORIENTATION_LABELS.index(i.label)
        for i in pages
    )


def test_orientation_classifier_batches(orientation):
    path, executor = orientation
    batch = np.concatenate([rd.orientation_input(i.image) for i in rd.rotated_pages()[:5]])
    ours = executor.run({"x": batch})["fetch_name_0"].cpu().numpy()
    theirs = run_onnxruntime(path, {"x": batch})["fetch_name_0"]
    assert ours.shape == (5, 4)
    assert relative_error(ours, theirs) <= REL_TOL


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_text_recognition_reads_rendered_lines(device):
    path = rd.ocr_model("rec")
    model = load_onnx(path)
    characters = model.metadata["character"].splitlines()
    executor = Executor(model, device)
    for text in rd.TEXT_LINES[:3]:
        x = rd.recognition_input(rd.render_text_line(text))
        ours = executor.run({"x": x})["fetch_name_0"].cpu().numpy()
        theirs = run_onnxruntime(str(path), {"x": x})["fetch_name_0"]
        assert relative_error(ours, theirs) <= REL_TOL, text
        assert rd.ctc_decode(ours[0], characters) == rd.ctc_decode(theirs[0], characters) == text


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_text_detection_matches_onnxruntime(device):
    path = rd.ocr_model("det")
    executor = Executor(load_onnx(path), device)
    x = rd.detection_input(np.concatenate([rd.render_text_line(t)[:, :400] for t in rd.TEXT_LINES[:3]]))
    ours = executor.run({"x": x})["fetch_name_0"].cpu().numpy()
    theirs = run_onnxruntime(str(path), {"x": x})["fetch_name_0"]
    assert ours.shape == theirs.shape == (1, 1, *x.shape[2:])
    assert relative_error(ours, theirs) <= REL_TOL
    # The text regions are found: most pixels under the rendered glyph rows score high.
    assert (ours > 0.3).mean() > 0.05
