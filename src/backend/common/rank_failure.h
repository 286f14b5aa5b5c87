// The tensor-parallel watchdog's error (docs/tp.md, "The watchdog"; docs/design.md,
// "Multi-process tensor parallelism"): a peer process that closed its
// connection (it exited or was killed) or sent nothing within the collective
// timeout (--collective-timeout). Thrown by the TCP rendezvous' all_gather
// (backend/common/tcp_rendezvous.h), hence by the CPU socket communicator and
// the engine's control channel; the forward pass adds the layer. what() is
// the one line the CLI prints after "fp8kv: " before it exits 1, e.g.
//   rank 1 lost during all_reduce (layer 3): peer closed the connection; rank 0 stops
//   rank 1 stalled during all_reduce (layer 3): nothing received within the collective timeout (2 s, --collective-timeout); rank 0 stops
// The group cannot continue after one (the TpRunner is marked broken).
#pragma once
#include <stdexcept>
#include <string>

namespace fp8kv {

class RankFailure : public std::runtime_error {
 public:
  enum class Kind { lost, stalled };

  // peer: the rank this process lost or waited for; self: this process's rank;
  // op: the collective or control step ("all_reduce", "the step broadcast");
  // reason: what the socket said. layer -1: outside the layers.
  RankFailure(Kind kind, int peer, int self, std::string op, std::string reason, int layer = -1)
      : std::runtime_error(line(kind, peer, self, op, reason, layer)),
        kind_(kind),
        peer_(peer),
        self_(self),
        layer_(layer),
        op_(std::move(op)),
        reason_(std::move(reason)) {}

  Kind kind() const { return kind_; }
  int peer() const { return peer_; }
  int self() const { return self_; }
  int layer() const { return layer_; }
  const std::string& op() const { return op_; }
  const std::string& reason() const { return reason_; }

  // The same failure, inside `layer` of the forward pass (kept if already set).
  RankFailure at_layer(int layer) const {
    return RankFailure(kind_, peer_, self_, op_, reason_, layer_ >= 0 ? layer_ : layer);
  }

 private:
  static std::string line(Kind kind, int peer, int self, const std::string& op, const std::string& reason,
                          int layer) {
    std::string s = "rank " + std::to_string(peer) + (kind == Kind::lost ? " lost during " : " stalled during ") + op;
    if (layer >= 0) s += " (layer " + std::to_string(layer) + ")";
    s += ": " + reason + "; rank " + std::to_string(self) + " stops";
    return s;
  }

  Kind kind_;
  int peer_, self_, layer_;
  std::string op_, reason_;
};

}  // namespace fp8kv
