package dev.scoring.client;

import dev.scoring.v1.LongDocuments;
import dev.scoring.v1.RerankDocument;
import dev.scoring.v1.RerankRequest;
import dev.scoring.v1.WindowAggregation;
import java.util.List;

/**
 * The rerank options the shortcuts leave out, set fluently: a model, top N, raw scores, a
 * per-request instruction (models whose GetInfo says {@code takes_instruction}) and consent to
 * score over-long documents in windows. Unset options keep the server's defaults.
 */
public final class RerankOptions {
  private final RerankRequest.Builder request = RerankRequest.newBuilder();

  public static RerankOptions defaults() {
    return new RerankOptions();
  }

  public RerankOptions model(String model) {
    request.setModel(model);
    return this;
  }

  public RerankOptions topN(int topN) {
    request.setTopN(topN);
    return this;
  }

  public RerankOptions returnRawScores() {
    request.setReturnRawScores(true);
    return this;
  }

  /** Replaces the model's task instruction (Qwen3-Reranker's {@code <Instruct>:} line). */
  public RerankOptions instruction(String instruction) {
    request.setInstruction(instruction);
    return this;
  }

  /** Windows as wide as fit beside the query, an eighth of a window of overlap, the best window. */
  public RerankOptions longDocuments() {
    request.setLongDocuments(LongDocuments.getDefaultInstance());
    return this;
  }

  /**
   * Windows of {@code windowTokens} tokens sharing {@code overlapTokens} with the one before;
   * {@code null} sizes take the server's defaults.
   */
  public RerankOptions longDocuments(
      Integer windowTokens, Integer overlapTokens, WindowAggregation aggregation) {
    LongDocuments.Builder options = LongDocuments.newBuilder().setAggregation(aggregation);
    if (windowTokens != null) {
      options.setWindowTokens(windowTokens);
    }
    if (overlapTokens != null) {
      options.setOverlapTokens(overlapTokens);
    }
    request.setLongDocuments(options);
    return this;
  }

  /** The request these options give for {@code query} and text {@code documents}. */
  public RerankRequest request(String query, List<String> documents) {
    RerankRequest.Builder built = request.clone().setQuery(query).clearDocuments();
    for (String document : documents) {
      built.addDocuments(RerankDocument.newBuilder().setText(document));
    }
    return built.build();
  }
}
