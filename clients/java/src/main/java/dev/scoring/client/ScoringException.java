package dev.scoring.client;

import com.google.rpc.BadRequest;
import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/** A failed call: the gRPC status, and for bad input the offending fields (google.rpc.BadRequest). */
public final class ScoringException extends RuntimeException {
  private final Status.Code code;
  private final List<BadRequest.FieldViolation> fieldViolations;

  ScoringException(StatusRuntimeException cause) {
    super(cause.getStatus().getCode() + ": " + cause.getStatus().getDescription(), cause);
    this.code = cause.getStatus().getCode();
    this.fieldViolations = Collections.unmodifiableList(violationsOf(cause));
  }

  public Status.Code code() {
    return code;
  }

  public List<BadRequest.FieldViolation> fieldViolations() {
    return fieldViolations;
  }

  /** Field paths as the server names them, e.g. {@code documents[3].text}. */
  public List<String> fields() {
    List<String> fields = new ArrayList<>();
    for (BadRequest.FieldViolation violation : fieldViolations) {
      fields.add(violation.getField());
    }
    return fields;
  }

  private static List<BadRequest.FieldViolation> violationsOf(StatusRuntimeException cause) {
    List<BadRequest.FieldViolation> violations = new ArrayList<>();
    com.google.rpc.Status status = StatusProto.fromThrowable(cause);
    if (status == null) {
      return violations;
    }
    for (Any detail : status.getDetailsList()) {
      if (detail.is(BadRequest.class)) {
        try {
          violations.addAll(detail.unpack(BadRequest.class).getFieldViolationsList());
        } catch (InvalidProtocolBufferException e) {
          throw new IllegalStateException("malformed BadRequest detail", e);
        }
      }
    }
    return violations;
  }
}
