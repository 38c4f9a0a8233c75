package dev.scoring.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import dev.scoring.v1.GetInfoResponse;
import dev.scoring.v1.ModelInfo;
import dev.scoring.v1.ModelKind;
import io.grpc.Status;
import java.awt.Color;
import java.awt.Graphics2D;
import java.awt.image.BufferedImage;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import javax.imageio.ImageIO;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/** Against the real server: `python -m scoring_server --demo`, started here, CPU demo models. */
public class ScoringClientTest {
  private static final String QUERY = "how do cats sleep";
  private static final List<String> DOCS =
      Arrays.asList(
          "The stock market closed higher on Friday.",
          "Cats sleep twelve to sixteen hours a day, mostly in short naps.",
          "A recipe for tomato soup with basil.",
          "Kittens and older cats sleep even more than adult cats.");

  private static Process server;
  private static ScoringClient client;
  private static int port;

  @BeforeClass
  public static void startServer() throws Exception {
    try (ServerSocket socket = new ServerSocket(0)) {
      port = socket.getLocalPort();
    }
    String python = System.getProperty("scoring.python", "python3");
    File log = new File("target/scoring-server.log");
    List<String> command = new ArrayList<>(Arrays.asList(python, "-m", "scoring_server", "--demo",
        "--demo-models", "minilm,qwen3-reranker,absa-bert,image-ranker", "--host", "127.0.0.1", "--port", String.valueOf(port)));
    String demoDir = System.getProperty("scoring.demoDir");
    if (demoDir != null && !demoDir.isEmpty()) {
      command.addAll(Arrays.asList("--demo-dir", demoDir));
    }
    server = new ProcessBuilder(command).redirectErrorStream(true).redirectOutput(log).start();
    client = ScoringClient.builder().target("127.0.0.1:" + port).deadline(Duration.ofSeconds(30)).build();
    long deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(10);
    while (true) {
      assertTrue("server exited early, see " + log, server.isAlive());
      try {
        GetInfoResponse info = client.info();
        if (!info.getModelsList().isEmpty()
            && info.getModelsList().stream().allMatch(ModelInfo::getReady)) {
          return;
        }
      } catch (ScoringException notYet) {
        // the port is not open yet: keep waiting
      }
      assertTrue("server not ready in time, see " + log, System.nanoTime() < deadline);
      Thread.sleep(1000);
    }
  }

  @AfterClass
  public static void stopServer() throws Exception {
    if (client != null) {
      client.close();
    }
    if (server != null) {
      server.destroy(); // SIGTERM: the server drains and exits 0
      assertTrue(server.waitFor(60, TimeUnit.SECONDS));
      assertEquals(0, server.exitValue());
    }
  }

  @Test
  public void rerankReturnsEveryDocumentSortedBestFirst() {
    RerankResult result = client.rerank(QUERY, DOCS, 0);
    assertEquals(DOCS.size(), result.hits.size());
    for (int i = 1; i < result.hits.size(); i++) {
      assertTrue(result.hits.get(i - 1).score >= result.hits.get(i).score);
    }
    List<Integer> top2 = Arrays.asList(result.hits.get(0).index, result.hits.get(1).index);
    Collections.sort(top2);
    assertEquals(Arrays.asList(1, 3), top2); // minilm has real weights: the cat documents win
    assertEquals("minilm", result.model);
    assertEquals("DTYPE_FLOAT32", result.dtype);
    assertTrue(result.promptTokens > 0);
  }

  @Test
  public void topNKeepsTheBest() {
    RerankResult all = client.rerank(QUERY, DOCS, 0);
    RerankResult top = client.rerank(QUERY, DOCS, 2);
    assertEquals(2, top.hits.size());
    assertEquals(all.hits.get(0).index, top.hits.get(0).index);
    assertEquals(all.hits.get(1).index, top.hits.get(1).index);
  }

  @Test
  public void asyncCallsComplete() throws Exception {
    RerankResult result =
        client.rerankAsync(ScoringClient.request(QUERY, DOCS, 1, null)).get(30, TimeUnit.SECONDS);
    assertEquals(1, result.hits.size());
  }

  @Test
  public void instructionChangesQwen3ScoresAndIsRefusedWithoutASlot() {
    RerankResult plain = client.rerank(QUERY, DOCS, RerankOptions.defaults().model("qwen3-reranker"));
    RerankResult instructed =
        client.rerank(
            QUERY, DOCS, RerankOptions.defaults().model("qwen3-reranker").instruction("Find pet care advice"));
    assertEquals(DOCS.size(), instructed.hits.size());
    assertTrue(plain.hits.get(0).score != instructed.hits.get(0).score
        || plain.hits.get(1).score != instructed.hits.get(1).score);
    try {
      client.rerank(QUERY, DOCS, RerankOptions.defaults().model("minilm").instruction("Find pet care advice"));
      fail("minilm's prompt has no instruction slot");
    } catch (ScoringException e) {
      assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
      assertEquals(Collections.singletonList("instruction"), e.fields());
    }
  }

  @Test
  public void longDocumentsAreScoredInWindowsWithTheWinningSpan() {
    String longDoc = String.join(" ", Collections.nCopies(300, "cats sleep on the warm sofa all day."));
    List<String> docs = Arrays.asList(DOCS.get(0), longDoc);
    try {
      client.rerank(QUERY, docs, RerankOptions.defaults().model("minilm"));
      fail("without long documents an over-long document is refused");
    } catch (ScoringException e) {
      assertEquals(Collections.singletonList("documents[1].text"), e.fields());
    }
    RerankResult result =
        client.rerank(
            QUERY, docs,
            RerankOptions.defaults().model("minilm").longDocuments(128, 16, dev.scoring.v1.WindowAggregation.WINDOW_AGGREGATION_MAX));
    RerankResult.Hit hit = result.hits.get(0).index == 1 ? result.hits.get(0) : result.hits.get(1);
    assertTrue(hit.windows >= 2);
    assertNotNull(hit.windowStart);
    assertTrue(hit.windowStart < hit.windowEnd && hit.windowEnd <= longDoc.length());
    RerankResult.Hit shortHit = result.hits.get(0).index == 0 ? result.hits.get(0) : result.hits.get(1);
    assertEquals(1, shortHit.windows);
    assertEquals(null, shortHit.windowStart);
    GetInfoResponse info = client.info();
    for (ModelInfo model : info.getModelsList()) {
      if (model.getName().equals("qwen3-reranker")) {
        assertTrue(model.getTakesInstruction());
        assertTrue(model.getMaxWindowsPerCall() >= model.getMaxWindowsPerDocument());
      }
    }
  }

  @Test
  public void badInputIsInvalidArgumentNamingTheField() {
    try {
      client.rerank("", DOCS, 0);
      fail("an empty query must be rejected");
    } catch (ScoringException e) {
      assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
      assertEquals(Collections.singletonList("query"), e.fields());
      assertFalse(e.fieldViolations().get(0).getDescription().isEmpty());
    }
    List<String> tooMany = Collections.nCopies(1000, "x");
    try {
      client.rerank(QUERY, tooMany, 0);
      fail("more documents than the advertised limit must be rejected");
    } catch (ScoringException e) {
      assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
      assertTrue(e.fields().contains("documents"));
    }
    try {
      client.rerank(QUERY, DOCS, 0, "no-such-model");
      fail("an unknown model must be rejected");
    } catch (ScoringException e) {
      assertEquals(Status.Code.NOT_FOUND, e.code());
      assertEquals(Collections.singletonList("model"), e.fields());
    }
  }

  @Test
  public void deadlinesAreEnforced() {
    List<String> many = Collections.nCopies(200, "cats sleep in the sun all afternoon, every day");
    try (ScoringClient hurried =
        ScoringClient.builder().target("127.0.0.1:" + port).deadline(Duration.ofMillis(1)).build()) {
      hurried.rerank(QUERY, many, 0);
      fail("a 1 ms deadline cannot be met");
    } catch (ScoringException e) {
      assertEquals(Status.Code.DEADLINE_EXCEEDED, e.code());
    }
  }

  @Test
  public void unreachableServerIsUnavailableAfterRetries() throws IOException {
    int closed;
    try (ServerSocket socket = new ServerSocket(0)) {
      closed = socket.getLocalPort();
    }
    try (ScoringClient lost =
        ScoringClient.builder()
            .target("127.0.0.1:" + closed)
            .deadline(Duration.ofSeconds(5))
            .maxAttempts(3)
            .initialBackoff(Duration.ofMillis(50))
            .build()) {
      lost.rerank(QUERY, DOCS, 0);
      fail("nothing listens there");
    } catch (ScoringException e) {
      assertEquals(Status.Code.UNAVAILABLE, e.code());
    }
  }

  @Test
  public void analyzeJudgesEachAspectWithEvidenceInTheReview() {
    String review = "The food was delicious but the wait was far too long.";
    AnalyzeResult result = client.analyze(review, Arrays.asList("food", "wait"));
    assertEquals("absa-bert", result.model);
    assertEquals(2, result.results.size());
    assertEquals("food", result.results.get(0).aspect);
    assertEquals("wait", result.results.get(1).aspect);
    for (AnalyzeResult.Judgement judged : result.results) {
      assertTrue(judged.probabilities.containsKey(judged.label));
      double total = judged.probabilities.values().stream().mapToDouble(Double::doubleValue).sum();
      assertEquals(1.0, total, 1e-6);
      if (judged.span != null) {
        int from = review.offsetByCodePoints(0, judged.span.start);
        int to = review.offsetByCodePoints(0, judged.span.end);
        assertEquals(judged.span.text, review.substring(from, to));
      }
    }
    try {
      client.analyze(review, Arrays.asList(""));
      fail("an empty aspect must be rejected");
    } catch (ScoringException e) {
      assertEquals(Status.Code.INVALID_ARGUMENT, e.code());
      assertEquals(Collections.singletonList("items[0].aspects[0]"), e.fields());
    }
  }

  @Test
  public void infoAdvertisesLimits() throws ExecutionException {
    GetInfoResponse info = client.info();
    assertNotNull(info.getVllmVersion());
    for (ModelInfo model : info.getModelsList()) {
      boolean images = model.getKind() == ModelKind.MODEL_KIND_IMAGE_RANK;
      assertEquals(images ? 64 : 256, model.getMaxItemsPerRequest());
      assertTrue(model.getMaxTokensPerItem() > 0);
      assertEquals(images, model.getMaxImageBytes() > 0);
    }
  }

  private static byte[] png(int width, int height, Color color) throws IOException {
    BufferedImage image = new BufferedImage(width, height, BufferedImage.TYPE_INT_RGB);
    Graphics2D g = image.createGraphics();
    g.setColor(color);
    g.fillRect(0, 0, width, height);
    g.setColor(Color.WHITE);
    g.fillOval(width / 4, height / 4, width / 2, height / 2);
    g.dispose();
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    ImageIO.write(image, "png", out);
    return out.toByteArray();
  }

  @Test
  public void connectionsSendCallsInTurnOverEachConnection() throws IOException {
    client.info(); // the shared client's connection is up before counting
    int before = connectionsToServer();
    try (ScoringClient spread =
        ScoringClient.builder().target("127.0.0.1:" + port).connections(3).build()) {
      // Channels connect on their first call: three calls in turn open all three.
      for (int i = 0; i < 3; i++) {
        assertEquals(DOCS.size(), spread.rerank(QUERY, DOCS, 0).hits.size());
      }
      assertEquals(before + 3, connectionsToServer());
    }
    try {
      ScoringClient.builder().target("127.0.0.1:" + port).connections(0).build();
      fail("connections must be >= 1");
    } catch (IllegalArgumentException expected) {
      assertTrue(expected.getMessage().contains("connections"));
    }
  }

  /** Established TCP connections to the server's port on this host (Linux's /proc/net/tcp*). */
  private static int connectionsToServer() throws IOException {
    String remotePort = String.format(":%04X", port);
    int count = 0;
    for (String table : Arrays.asList("/proc/net/tcp", "/proc/net/tcp6")) {
      java.nio.file.Path path = java.nio.file.Paths.get(table);
      if (!java.nio.file.Files.exists(path)) {
        continue;
      }
      for (String line : java.nio.file.Files.readAllLines(path)) {
        String[] fields = line.trim().split("\\s+");
        // sl local_address rem_address st ...; state 01 is ESTABLISHED
        if (fields.length > 3 && fields[2].endsWith(remotePort) && fields[3].equals("01")) {
          count++;
        }
      }
    }
    return count;
  }

  @Test
  public void rankImagesScoresEveryLoadableImageAndNamesTheBrokenOne() throws IOException {
    byte[] red = png(80, 60, Color.RED);
    byte[] blue = png(60, 90, Color.BLUE);
    byte[] broken = "not an image".getBytes(StandardCharsets.UTF_8);
    RankImagesResult result = client.rankImages("cozy cafe interior", Arrays.asList(red, broken, blue, red));
    assertEquals("image-ranker", result.model);
    assertEquals("DTYPE_FLOAT32", result.dtype);
    assertEquals(4, result.results.size());
    List<RankImagesResult.RankedImage> scored = result.results.subList(0, 3);
    for (int i = 1; i < scored.size(); i++) {
      assertTrue(scored.get(i - 1).score >= scored.get(i).score);
      assertTrue(scored.get(i).error == null);
    }
    double first = Double.NaN;
    double last = Double.NaN;
    for (RankImagesResult.RankedImage image : scored) {
      if (image.index == 0) {
        first = image.score;
      } else if (image.index == 3) {
        last = image.score;
      }
    }
    assertEquals(first, last, 0.0); // the same image twice: the same score
    RankImagesResult.RankedImage failed = result.results.get(3);
    assertEquals(1, failed.index);
    assertEquals(Status.Code.INVALID_ARGUMENT, failed.error.getCode());
    assertTrue(failed.error.getDescription().contains("images[1].data"));
    assertTrue(Double.isNaN(failed.score));
  }
}
