package dev.scoring.client;

import dev.scoring.v1.ImageResult;
import dev.scoring.v1.RankImagesResponse;
import io.grpc.Status;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/** Scored images best first, then the images that could not be loaded, in request order. */
public final class RankImagesResult {
  /** {@code error} is null for a scored image; {@code score} is NaN for a failed one. */
  public static final class RankedImage {
    public final int index;
    public final String id;
    public final double score;
    /** Why this image was not scored (its code and a message naming the field), or null. */
    public final Status error;

    RankedImage(ImageResult r) {
      this.index = r.getIndex();
      this.id = r.hasId() ? r.getId() : null;
      this.error =
          r.hasError()
              ? Status.fromCodeValue(r.getError().getCode()).withDescription(r.getError().getMessage())
              : null;
      this.score = r.hasError() ? Double.NaN : r.getScore();
    }
  }

  public final List<RankedImage> results;
  public final String model;
  public final String dtype;
  /** The raw response, for fields this class does not surface (timings, usage). */
  public final RankImagesResponse response;

  RankImagesResult(RankImagesResponse response) {
    List<RankedImage> results = new ArrayList<>();
    for (ImageResult r : response.getResultsList()) {
      results.add(new RankedImage(r));
    }
    this.results = Collections.unmodifiableList(results);
    this.model = response.getModel();
    this.dtype = response.getDtype().name();
    this.response = response;
  }
}
