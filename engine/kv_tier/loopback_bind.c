/* bind() that keeps a process's wildcard listeners on one address (LD_PRELOAD).
 *
 * Mooncake 0.3.13 binds its P2P handshake listener to INADDR_ANY and its TCP transport to [::]
 * whatever it is told (transfer_metadata_plugin.cpp, tcp_transport.cpp). rollout-serve preloads
 * this library into the processes that run Mooncake (engine/kv_tier/native.py): a bind to the
 * wildcard address goes to ROLLOUT_SERVE_BIND_HOST instead (an IPv4 address, engine.internal_host).
 * An IPv6 wildcard becomes that address IPv4-mapped (::ffff:a.b.c.d: the socket still takes the
 * IPv4 connections its peers make), or ::1 on an IPv6-only socket when the host is loopback.
 * Every other bind, and every bind without the variable, is passed through unchanged.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind)
        real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    const char *host = getenv("ROLLOUT_SERVE_BIND_HOST");
    struct in_addr v4;
    if (addr == NULL || host == NULL || inet_pton(AF_INET, host, &v4) != 1)
        return real_bind(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in = *(const struct sockaddr_in *)addr;
        if (in.sin_addr.s_addr != htonl(INADDR_ANY))
            return real_bind(fd, addr, len);
        in.sin_addr = v4;
        return real_bind(fd, (const struct sockaddr *)&in, sizeof in);
    }
    if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6 = *(const struct sockaddr_in6 *)addr;
        if (!IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr))
            return real_bind(fd, addr, len);
        int v6only = 0;
        socklen_t size = sizeof v6only;
        if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &size) != 0)
            v6only = 0;
        if (v6only) {
            if ((ntohl(v4.s_addr) >> 24) != 127) {  /* no IPv6 form of a v4 host: refuse rather than open */
                errno = EADDRNOTAVAIL;
                return -1;
            }
            in6.sin6_addr = in6addr_loopback;
        } else {
            unsigned char *b = in6.sin6_addr.s6_addr;
            for (int i = 0; i < 10; i++) b[i] = 0;
            b[10] = b[11] = 0xff;
            memcpy(b + 12, &v4, 4);
        }
        return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
    }
    return real_bind(fd, addr, len);
}
