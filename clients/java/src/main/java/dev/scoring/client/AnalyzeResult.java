package dev.scoring.client;

import dev.scoring.v1.AnalyzeResponse;
import dev.scoring.v1.AspectSentiment;
import dev.scoring.v1.LabelProbability;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** One judgement per (aspect, review) pair, in request order, with the model and dtype. */
public final class AnalyzeResult {
  /** Evidence in the review: {@code review.substring} over code points {@code [start, end)}. */
  public static final class Evidence {
    public final String text;
    public final int start;
    public final int end;
    public final double score;

    Evidence(String text, int start, int end, double score) {
      this.text = text;
      this.start = start;
      this.end = end;
      this.score = score;
    }
  }

  /** {@code span} is null when no span scored above the model's minimum. */
  public static final class Judgement {
    public final int index;
    public final String aspect;
    public final String label;
    /** Every label of the model, in its id order. */
    public final Map<String, Double> probabilities;
    public final Evidence span;

    Judgement(AspectSentiment r) {
      Map<String, Double> probabilities = new LinkedHashMap<>();
      for (LabelProbability p : r.getProbabilitiesList()) {
        probabilities.put(p.getLabel(), p.getProbability());
      }
      this.index = r.getIndex();
      this.aspect = r.getAspect();
      this.label = r.getLabel();
      this.probabilities = Collections.unmodifiableMap(probabilities);
      this.span =
          r.hasSpan()
              ? new Evidence(r.getSpan().getText(), r.getSpan().getStart(), r.getSpan().getEnd(), r.getSpan().getScore())
              : null;
    }
  }

  public final List<Judgement> results;
  public final String model;
  public final String dtype;
  public final long promptTokens;
  /** The raw response, for fields this class does not surface (timings, ids). */
  public final AnalyzeResponse response;

  AnalyzeResult(AnalyzeResponse response) {
    List<Judgement> results = new ArrayList<>();
    for (AspectSentiment r : response.getResultsList()) {
      results.add(new Judgement(r));
    }
    this.results = Collections.unmodifiableList(results);
    this.model = response.getModel();
    this.dtype = response.getDtype().name();
    this.promptTokens = response.getUsage().getPromptTokens();
    this.response = response;
  }
}
