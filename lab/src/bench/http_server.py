"""A real HTTP server (Python's ThreadingHTTPServer serving files) whose
listening socket uses a chosen TCP congestion controller: accepted
connections inherit TCP_CONGESTION, and this kernel's default is BBR, not the
CUBIC the paper's TCP ran. Used by `quicsdn-lab bench bicast`.

    http_server.py CONGESTION BIND_IP PORT DIRECTORY
"""

import functools
import http.server
import socket
import sys


def main():
    cc, bind, port, root = sys.argv[1:5]

    class Server(http.server.ThreadingHTTPServer):
        def server_bind(self):
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
            super().server_bind()

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
    server = Server((bind, int(port)), handler)
    print("serving %s on %s:%s with %s" % (root, bind, port, cc), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
