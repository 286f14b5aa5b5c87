// HTTP framing as the connection layer checks it before httplib parses a
// request (src/server/connections.h, issue 37 C6).
#include <gtest/gtest.h>

#include <string>

#include "server/connections.h"

using fp8kv::server::Framing;
using fp8kv::server::frame_request;

namespace {
constexpr size_t kHead = 64 << 10, kBody = 1 << 20;
Framing frame(const std::string& s) { return frame_request(s, kHead, kBody); }
}  // namespace

TEST(ServerFraming, ContentLengthDelimitsTheRequest) {
  const std::string r = "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
  Framing f = frame(r);
  EXPECT_EQ(f.kind, Framing::complete);
  EXPECT_EQ(f.total, r.size());
  EXPECT_EQ(frame(r.substr(0, r.size() - 1)).kind, Framing::incomplete);
  EXPECT_EQ(frame(r.substr(0, 20)).kind, Framing::incomplete);
  // Pipelined: the first request ends where the second begins.
  f = frame(r + "GET /health HTTP/1.1\r\n\r\n");
  EXPECT_EQ(f.kind, Framing::complete);
  EXPECT_EQ(f.total, r.size());
  // Equal repeated values are one length (RFC 9110 8.6).
  EXPECT_EQ(frame("POST / HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 2, 2\r\n\r\nab").kind, Framing::complete);
  // LF-only lines.
  EXPECT_EQ(frame("GET / HTTP/1.1\nHost: a\n\n").kind, Framing::complete);
}

TEST(ServerFraming, AmbiguousOrInvalidLengthsAre400AtOnce) {
  for (const char* h : {"Content-Length: 5\r\nContent-Length: 7\r\n", "Content-Length: 5, 7\r\n", "Content-Length: -5\r\n",
                        "Content-Length: +5\r\n", "Content-Length: 5x\r\n", "Content-Length:\r\n",
                        "Content-Length: 0x10\r\n", "Content-Length: 99999999999999999999999\r\n",
                        "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n"}) {
    // Only the head has arrived: the answer must not wait for a body.
    const Framing f = frame(std::string("POST / HTTP/1.1\r\n") + h + "\r\n");
    EXPECT_EQ(f.kind, Framing::error) << h;
    EXPECT_EQ(f.status, 400) << h;
  }
  EXPECT_NE(frame("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n").message.find("conflicting"),
            std::string::npos);
}

TEST(ServerFraming, LimitsAreCheckedFromTheHead) {
  Framing f = frame("POST / HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n");
  EXPECT_EQ(f.kind, Framing::error);
  EXPECT_EQ(f.status, 413);
  f = frame("GET / HTTP/1.1\r\nX: " + std::string(kHead, 'a'));
  EXPECT_EQ(f.status, 431);
  f = frame("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n");
  EXPECT_EQ(f.status, 501);
}

TEST(ServerFraming, ChunkedBodiesEndAtTheLastChunk) {
  const std::string head = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string body = "3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nTrailer: x\r\n\r\n";
  Framing f = frame(head + body + "GET / HTTP/1.1\r\n\r\n");
  EXPECT_EQ(f.kind, Framing::complete);
  EXPECT_EQ(f.total, head.size() + body.size());
  for (size_t cut = 0; cut < body.size(); ++cut)
    EXPECT_EQ(frame(head + body.substr(0, cut)).kind, Framing::incomplete) << cut;
  EXPECT_EQ(frame(head + "zz\r\n").status, 400);
  EXPECT_EQ(frame(head + "3\r\nabcX\r\n").status, 400);
  EXPECT_EQ(frame(head + "fffffff\r\n").status, 413);
}

TEST(ServerFraming, ExpectContinueIsFound) {
  const Framing f = frame("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n");
  EXPECT_EQ(f.kind, Framing::incomplete);
  EXPECT_TRUE(f.expect_continue);
  EXPECT_GT(f.head_end, 0u);
  EXPECT_EQ(f.expect_begin, std::string("POST / HTTP/1.1\r\n").size());
}
