package dev.scoring.client;

import dev.scoring.v1.RerankResponse;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/** Results sorted best first, with the model and dtype that produced them. */
public final class RerankResult {
  /** One scored document. {@code id} and {@code text} are null when not requested or not sent. */
  public static final class Hit {
    public final int index;
    public final double score;
    public final String id;
    public final String text;
    /** Windows the document was scored in (long documents); 1 when scored whole. */
    public final int windows;
    /**
     * The reported window's span in the document's text, in Unicode code points, end exclusive
     * (note: Java strings count UTF-16 units); null unless the text was scored in 2+ windows.
     */
    public final Integer windowStart;
    public final Integer windowEnd;

    Hit(dev.scoring.v1.RerankResult r) {
      this.index = r.getIndex();
      this.score = r.getScore();
      this.id = r.hasId() ? r.getId() : null;
      this.text = r.hasDocument() ? r.getDocument().getText() : null;
      this.windows = r.getWindows();
      this.windowStart = r.hasWindow() ? r.getWindow().getStart() : null;
      this.windowEnd = r.hasWindow() ? r.getWindow().getEnd() : null;
    }
  }

  public final List<Hit> hits;
  public final String model;
  public final String dtype;
  public final String requestId;
  public final long promptTokens;
  /** The raw response, for fields this class does not surface (timings, raw scores). */
  public final RerankResponse response;

  RerankResult(RerankResponse response) {
    List<Hit> hits = new ArrayList<>();
    for (dev.scoring.v1.RerankResult r : response.getResultsList()) {
      hits.add(new Hit(r));
    }
    this.hits = Collections.unmodifiableList(hits);
    this.model = response.getModel();
    this.dtype = response.getDtype().name();
    this.requestId = response.getRequestId();
    this.promptTokens = response.getUsage().getPromptTokens();
    this.response = response;
  }
}
