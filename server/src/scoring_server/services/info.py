"""InfoService: what is served and the limits, so clients size requests up front."""

from __future__ import annotations

import grpc
import vllm

from scoring.v1 import common_pb2, info_pb2, info_pb2_grpc, rerank_pb2
from scoring_plugin.io_processors.absa import AbsaIOProcessor
from scoring_plugin.io_processors.image_ranker import ImageRankerIOProcessor
from scoring_plugin.packed.families.registry import PACKED_KINDS
from scoring_plugin.rerank.settings import RerankMode
from scoring_plugin.rerank.types import Activation
from scoring_server import __version__
from scoring_server.config import ModelKind, ServerSettings
from scoring_server.engines import ModelRegistry
from scoring_server.services.execution import DTYPES

_KINDS = {
    ModelKind.RERANK: common_pb2.MODEL_KIND_RERANK,
    ModelKind.ABSA: common_pb2.MODEL_KIND_ABSA,
    ModelKind.IMAGE_RANK: common_pb2.MODEL_KIND_IMAGE_RANK,
}
_MODES = {
    RerankMode.CROSS_ENCODER: rerank_pb2.RERANK_MODE_CROSS_ENCODER,
    RerankMode.BI_ENCODER: rerank_pb2.RERANK_MODE_BI_ENCODER,
    RerankMode.LATE_INTERACTION: rerank_pb2.RERANK_MODE_LATE_INTERACTION,
}
_MATMUL_PRECISIONS = {
    "highest": info_pb2.FLOAT32_MATMUL_PRECISION_HIGHEST,
    "high": info_pb2.FLOAT32_MATMUL_PRECISION_HIGH,
    "medium": info_pb2.FLOAT32_MATMUL_PRECISION_MEDIUM,
    "tf32x3": info_pb2.FLOAT32_MATMUL_PRECISION_TF32X3,
}
_ACTIVATIONS = {
    Activation.NONE: rerank_pb2.ACTIVATION_NONE,
    Activation.SIGMOID: rerank_pb2.ACTIVATION_SIGMOID,
    Activation.SOFTMAX: rerank_pb2.ACTIVATION_SOFTMAX,
}


class InfoServicer(info_pb2_grpc.InfoServiceServicer):
    def __init__(self, registry: ModelRegistry, settings: ServerSettings) -> None:
        self._registry = registry
        self._settings = settings

    async def GetInfo(
        self, request: info_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> info_pb2.GetInfoResponse:
        return self.describe()

    def describe(self) -> info_pb2.GetInfoResponse:
        """The server and every model as they stand now; both doors answer with it (gRPC
        GetInfo, HTTP GET /scoring/v1/info)."""
        response = info_pb2.GetInfoResponse(
            max_receive_message_bytes=self._settings.max_receive_message_bytes,
            max_send_message_bytes=self._settings.max_send_message_bytes,
            server_version=__version__,
            vllm_version=vllm.__version__,
            frontends=self._settings.frontends,
        )
        for model in self._registry.models.values():
            info = response.models.add(
                name=model.settings.name,
                kind=_KINDS[model.settings.kind],
                dtype=DTYPES[model.settings.dtype],
                architecture=model.architecture,
                max_items_per_request=model.settings.max_items_per_request,
                ready=model.ready,
                is_default=self._registry.is_default(model),
                max_concurrent_requests=model.admission.max_requests,
                max_queued_items=model.admission.max_items,
            )
            if model.settings.kind.value in PACKED_KINDS:
                packing = model.settings.packing
                info.packing.CopyFrom(info_pb2.PackingInfo(
                    enabled=packing.enabled, packed=model.settings.packs(),
                    unpacked_reason=model.settings.unpacked_reason() or "", pack_tokens=packing.pack_tokens,
                    graphs=packing.graphs, full_graph_tokens=packing.full_graph_tokens,
                ))
            precision = model.settings.served_matmul_precision()
            if precision is not None:
                info.float32_matmul_precision = _MATMUL_PRECISIONS[precision]
            processor = model.processor
            if processor is not None:
                info.max_tokens_per_item = processor.max_model_len
                info.pending_request_states = processor.pending_states
            if isinstance(processor, AbsaIOProcessor):
                info.labels.extend(processor.settings.labels)
                info.max_aspect_chars = processor.settings.max_aspect_chars
                info.max_review_chars = processor.settings.max_review_chars
            elif isinstance(processor, ImageRankerIOProcessor):
                image = processor.settings
                info.max_image_bytes = image.max_image_bytes
                info.max_image_pixels = image.max_image_pixels
                info.max_image_side = image.max_image_side
                info.image_size = image.image_size
                info.fetch_timeout_ms = round(image.fetch_timeout_s * 1000)
                info.max_pixels_per_request = image.max_pixels_per_request
                info.max_query_chars = image.max_query_chars
                info.image_decode_device = image.decode_device
            elif processor is not None:
                rerank = processor.settings
                info.rerank_mode = _MODES[rerank.mode]
                info.default_activation = _ACTIVATIONS[rerank.default_activation.activation]
                info.activation_source = rerank.default_activation.source
                info.max_query_chars = rerank.max_query_chars
                info.max_document_chars = rerank.max_document_chars
                info.takes_instruction = rerank.takes_instruction
                info.default_instruction = rerank.default_instruction
                info.max_windows_per_call = rerank.max_windows_per_call
                info.max_windows_per_document = rerank.max_windows_per_document
                if rerank.mode is RerankMode.CROSS_ENCODER:
                    info.num_labels = rerank.num_labels
                    info.score_label = rerank.score_label_name
            info.data_parallel_size = len(model.cores)
            for core in model.cores:
                info.cores.add(
                    index=core.index, devices=core.devices, ready=core.up, items_in_flight=core.items_in_flight,
                    calls_in_flight=core.calls_in_flight,
                    engine_requests_in_flight=(
                        core.engine.output_processor.get_num_unfinished_requests() if core.engine is not None else 0
                    ),
                )
            info.engine_requests_in_flight = sum(core.engine_requests_in_flight for core in info.cores)
        return response
