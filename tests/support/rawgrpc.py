"""What the shell tests' Python snippets share (python3 -c "$py"): raw
TCP connections that never speak, and a health Watch followed in the
background.  lib.sh puts this folder on PYTHONPATH."""
import socket
import threading

import grpc


def open_raw(addr, n):
    """n TCP connections to HOST:PORT that send nothing, non-blocking."""
    host, port = addr.rsplit(":", 1)
    socks = [socket.create_connection((host, int(port))) for _ in range(n)]
    for s in socks:
        s.setblocking(False)
    return socks


def closed(socks):
    """How many of @socks the other end has closed."""
    n = 0
    for s in socks:
        try:
            n += s.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            n += 1
    return n


def watch_health(ch):
    """Opens a grpc.health.v1 Watch on channel @ch, reads its first answer
    and follows it in a thread.  Returns a list that stays empty while the
    stream is open, then holds "end" or the gRPC code's name."""
    watch = ch.unary_stream("/grpc.health.v1.Health/Watch",
                            request_serializer=lambda b: b,
                            response_deserializer=lambda b: b)(b"")
    next(watch)
    ended = []

    def follow():
        try:
            for _ in watch:
                pass
            ended.append("end")
        except grpc.RpcError as e:
            ended.append(e.code().name)

    threading.Thread(target=follow, daemon=True).start()
    return ended
