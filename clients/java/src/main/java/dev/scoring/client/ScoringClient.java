package dev.scoring.client;

import com.google.common.util.concurrent.FutureCallback;
import com.google.common.util.concurrent.Futures;
import com.google.common.util.concurrent.MoreExecutors;
import dev.scoring.v1.AbsaItem;
import dev.scoring.v1.AbsaServiceGrpc;
import dev.scoring.v1.AnalyzeRequest;
import dev.scoring.v1.GetInfoRequest;
import dev.scoring.v1.GetInfoResponse;
import dev.scoring.v1.ImageInput;
import dev.scoring.v1.ImageRankServiceGrpc;
import dev.scoring.v1.InfoServiceGrpc;
import dev.scoring.v1.RankImagesRequest;
import dev.scoring.v1.RerankDocument;
import dev.scoring.v1.RerankRequest;
import dev.scoring.v1.RerankResponse;
import dev.scoring.v1.RerankServiceGrpc;
import com.google.protobuf.ByteString;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.MetadataUtils;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Supplier;

/**
 * Client of the scoring service. One instance owns one channel (or {@link Builder#connections}
 * of them): create it once and share it (channels multiplex calls; a channel per call throws away
 * connection reuse).
 *
 * <p>Every call carries a deadline, so a slow server costs the caller a bounded wait. Calls that
 * fail with UNAVAILABLE (server starting, draining, restarting) are retried with exponential
 * backoff by gRPC's own retry machinery; everything else surfaces at once as {@link
 * ScoringException}.
 */
public final class ScoringClient implements AutoCloseable {
  private final List<Connection> connections;
  private final AtomicInteger turn = new AtomicInteger();
  private final Duration deadline;

  /**
   * One channel and its stubs. A server with several front-end processes ({@code frontends}) has
   * the kernel spread connections, not calls, over them, so one channel reaches one process.
   */
  private static final class Connection {
    final ManagedChannel channel;
    final RerankServiceGrpc.RerankServiceBlockingStub rerankBlocking;
    final RerankServiceGrpc.RerankServiceFutureStub rerankFuture;
    final InfoServiceGrpc.InfoServiceBlockingStub info;
    final AbsaServiceGrpc.AbsaServiceBlockingStub absa;
    final ImageRankServiceGrpc.ImageRankServiceBlockingStub images;

    Connection(ManagedChannel channel) {
      this.channel = channel;
      this.rerankBlocking = RerankServiceGrpc.newBlockingStub(channel);
      this.rerankFuture = RerankServiceGrpc.newFutureStub(channel);
      this.info = InfoServiceGrpc.newBlockingStub(channel);
      this.absa = AbsaServiceGrpc.newBlockingStub(channel);
      this.images = ImageRankServiceGrpc.newBlockingStub(channel);
    }
  }

  private ScoringClient(Builder builder) {
    List<Connection> opened = new ArrayList<>();
    for (int i = 0; i < builder.connections; i++) {
      opened.add(new Connection(channel(builder)));
    }
    this.connections = Collections.unmodifiableList(opened);
    this.deadline = builder.deadline;
  }

  /** grpc-java channels never share connections, so each one built here is a connection of its own. */
  private static ManagedChannel channel(Builder builder) {
    ManagedChannelBuilder<?> channelBuilder =
        ManagedChannelBuilder.forTarget(builder.target)
            .defaultServiceConfig(retryConfig(builder.maxAttempts, builder.initialBackoff))
            .enableRetry()
            .maxInboundMessageSize(builder.maxMessageBytes);
    if (builder.plaintext) {
      channelBuilder.usePlaintext();
    }
    if (builder.bearerToken != null) {
      Metadata headers = new Metadata();
      headers.put(
          Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER),
          "Bearer " + builder.bearerToken);
      channelBuilder.intercept(MetadataUtils.newAttachHeadersInterceptor(headers));
    }
    return channelBuilder.build();
  }

  /** The connection of the next scoring call: each in turn. */
  private Connection next() {
    return connections.get(Math.floorMod(turn.getAndIncrement(), connections.size()));
  }

  public static Builder builder() {
    return new Builder();
  }

  /** Scores {@code documents} against {@code query}; {@code topN <= 0} returns all of them. */
  public RerankResult rerank(String query, List<String> documents, int topN) {
    return rerank(request(query, documents, topN, null));
  }

  public RerankResult rerank(String query, List<String> documents, int topN, String model) {
    return rerank(request(query, documents, topN, model));
  }

  /** With options: a model, an instruction, long documents in windows (see RerankOptions). */
  public RerankResult rerank(String query, List<String> documents, RerankOptions options) {
    return rerank(options.request(query, documents));
  }

  /** The full request, for options the shortcuts do not cover. */
  public RerankResult rerank(RerankRequest request) {
    return new RerankResult(
        blocking(() -> next().rerankBlocking.withDeadlineAfter(deadline.toMillis(), TimeUnit.MILLISECONDS).rerank(request)));
  }

  /** Non-blocking: the future fails with {@link ScoringException}. */
  public CompletableFuture<RerankResult> rerankAsync(RerankRequest request) {
    CompletableFuture<RerankResult> result = new CompletableFuture<>();
    Futures.addCallback(
        next().rerankFuture.withDeadlineAfter(deadline.toMillis(), TimeUnit.MILLISECONDS).rerank(request),
        new FutureCallback<RerankResponse>() {
          @Override
          public void onSuccess(RerankResponse response) {
            result.complete(new RerankResult(response));
          }

          @Override
          public void onFailure(Throwable error) {
            result.completeExceptionally(
                error instanceof StatusRuntimeException
                    ? new ScoringException((StatusRuntimeException) error)
                    : error);
          }
        },
        MoreExecutors.directExecutor());
    return result;
  }

  /** Aspect sentiment for each aspect of one review, in the order given. */
  public AnalyzeResult analyze(String review, List<String> aspects) {
    return analyze(
        AnalyzeRequest.newBuilder()
            .addItems(AbsaItem.newBuilder().setReview(review).addAllAspects(aspects))
            .build());
  }

  /** The full request: several items and (aspect, review) pairs, a model, truncation. */
  public AnalyzeResult analyze(AnalyzeRequest request) {
    return new AnalyzeResult(
        blocking(() -> next().absa.withDeadlineAfter(deadline.toMillis(), TimeUnit.MILLISECONDS).analyze(request)));
  }

  /** Ranks encoded images (JPEG, PNG or WebP bytes, sent as they are) for a text query. */
  public RankImagesResult rankImages(String query, List<byte[]> encodedImages) {
    RankImagesRequest.Builder request = RankImagesRequest.newBuilder().setQuery(query);
    for (byte[] image : encodedImages) {
      request.addImages(ImageInput.newBuilder().setData(ByteString.copyFrom(image)));
    }
    return rankImages(request.build());
  }

  /** The full request: URLs, ids, top N, a model, query truncation. */
  public RankImagesResult rankImages(RankImagesRequest request) {
    return new RankImagesResult(
        blocking(() -> next().images.withDeadlineAfter(deadline.toMillis(), TimeUnit.MILLISECONDS).rankImages(request)));
  }

  public GetInfoResponse info() {
    return blocking(
        () -> connections.get(0).info.withDeadlineAfter(deadline.toMillis(), TimeUnit.MILLISECONDS)
            .getInfo(GetInfoRequest.getDefaultInstance()));
  }

  /** Every blocking call surfaces gRPC failures the same way. */
  private static <T> T blocking(Supplier<T> call) {
    try {
      return call.get();
    } catch (StatusRuntimeException e) {
      throw new ScoringException(e);
    }
  }

  public static RerankRequest request(String query, List<String> documents, int topN, String model) {
    RerankRequest.Builder request = RerankRequest.newBuilder().setQuery(query);
    for (String document : documents) {
      request.addDocuments(RerankDocument.newBuilder().setText(document));
    }
    if (topN > 0) {
      request.setTopN(topN);
    }
    if (model != null) {
      request.setModel(model);
    }
    return request.build();
  }

  @Override
  public void close() {
    for (Connection connection : connections) {
      connection.channel.shutdown();
    }
    try {
      for (Connection connection : connections) {
        if (!connection.channel.awaitTermination(5, TimeUnit.SECONDS)) {
          connection.channel.shutdownNow();
        }
      }
    } catch (InterruptedException e) {
      for (Connection connection : connections) {
        connection.channel.shutdownNow();
      }
      Thread.currentThread().interrupt();
    }
  }

  private static Map<String, Object> retryConfig(int maxAttempts, Duration initialBackoff) {
    Map<String, Object> retryPolicy = new HashMap<>();
    retryPolicy.put("maxAttempts", (double) maxAttempts);
    retryPolicy.put("initialBackoff", initialBackoff.toMillis() / 1000.0 + "s");
    retryPolicy.put("maxBackoff", "2s");
    retryPolicy.put("backoffMultiplier", 2.0);
    retryPolicy.put("retryableStatusCodes", Arrays.asList("UNAVAILABLE"));
    Map<String, Object> methodConfig = new HashMap<>();
    methodConfig.put(
        "name",
        Arrays.asList(
            Map.of("service", "scoring.v1.RerankService"),
            Map.of("service", "scoring.v1.AbsaService"),
            Map.of("service", "scoring.v1.InfoService")));
    methodConfig.put("retryPolicy", retryPolicy);
    return Map.of("methodConfig", Arrays.asList(methodConfig));
  }

  /** {@code ScoringClient.builder().target("host:port").deadline(Duration.ofMillis(50)).build()} */
  public static final class Builder {
    private String target;
    private Duration deadline = Duration.ofSeconds(10);
    private boolean plaintext = true;
    private int maxAttempts = 4;
    private Duration initialBackoff = Duration.ofMillis(100);
    private int maxMessageBytes = 16 * 1024 * 1024;
    private String bearerToken;
    private int connections = 1;

    public Builder target(String target) {
      this.target = target;
      return this;
    }

    public Builder deadline(Duration deadline) {
      this.deadline = deadline;
      return this;
    }

    /** TLS instead of plaintext (the JVM's trust store verifies the server's certificate). */
    public Builder useTransportSecurity() {
      this.plaintext = false;
      return this;
    }

    /** Attempts in total for calls failing with UNAVAILABLE (1 disables retries). */
    public Builder maxAttempts(int maxAttempts) {
      this.maxAttempts = maxAttempts;
      return this;
    }

    public Builder initialBackoff(Duration initialBackoff) {
      this.initialBackoff = initialBackoff;
      return this;
    }

    /** Sent as {@code authorization: Bearer <token>} on every call (servers with auth on). */
    public Builder bearerToken(String token) {
      this.bearerToken = token;
      return this;
    }

    public Builder maxMessageBytes(int maxMessageBytes) {
      this.maxMessageBytes = maxMessageBytes;
      return this;
    }

    /**
     * Opens {@code connections} connections and sends the scoring calls over them in turn: for a
     * server with several front-end processes ({@code frontends}), which the kernel assigns whole
     * connections to. At low load fewer connections answer faster (each stays warm).
     */
    public Builder connections(int connections) {
      this.connections = connections;
      return this;
    }

    public ScoringClient build() {
      if (target == null || target.isEmpty()) {
        throw new IllegalArgumentException("target is required, e.g. \"localhost:50051\"");
      }
      if (connections < 1) {
        throw new IllegalArgumentException("connections must be >= 1, got " + connections);
      }
      return new ScoringClient(this);
    }
  }
}
