#include "shim.h"

uint32_t ferry_fi_version(void) { return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION); }
struct fi_info *ferry_fi_allocinfo(void) { return fi_allocinfo(); }
int ferry_fi_close(struct fid *fid) { return fi_close(fid); }
int ferry_fi_domain(struct fid_fabric *fabric, struct fi_info *info,
                    struct fid_domain **domain, void *context) {
    return fi_domain(fabric, info, domain, context);
}
int ferry_fi_endpoint(struct fid_domain *domain, struct fi_info *info,
                      struct fid_ep **ep, void *context) {
    return fi_endpoint(domain, info, ep, context);
}
int ferry_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
                     struct fid_av **av, void *context) {
    return fi_av_open(domain, attr, av, context);
}
int ferry_fi_av_insert(struct fid_av *av, const void *addr, size_t count,
                       fi_addr_t *fi_addr, uint64_t flags, void *context) {
    return fi_av_insert(av, addr, count, fi_addr, flags, context);
}
int ferry_fi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count,
                       uint64_t flags) {
    return fi_av_remove(av, fi_addr, count, flags);
}
int ferry_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
                     struct fid_cq **cq, void *context) {
    return fi_cq_open(domain, attr, cq, context);
}
int ferry_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags) {
    return fi_ep_bind(ep, bfid, flags);
}
int ferry_fi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags) {
    return fi_mr_bind(mr, bfid, flags);
}
int ferry_fi_mr_enable(struct fid_mr *mr) { return fi_mr_enable(mr); }
int ferry_fi_enable(struct fid_ep *ep) { return fi_enable(ep); }
int ferry_fi_getname(struct fid *fid, void *addr, size_t *addrlen) {
    return fi_getname(fid, addr, addrlen);
}
int ferry_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len,
                    uint64_t access, uint64_t offset, uint64_t requested_key,
                    uint64_t flags, struct fid_mr **mr, void *context) {
    return fi_mr_reg(domain, buf, len, access, offset, requested_key, flags, mr, context);
}
void *ferry_fi_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }
uint64_t ferry_fi_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }
ssize_t ferry_fi_cq_read(struct fid_cq *cq, void *buf, size_t count) {
    return fi_cq_read(cq, buf, count);
}
ssize_t ferry_fi_cq_sread(struct fid_cq *cq, void *buf, size_t count,
                          const void *cond, int timeout) {
    return fi_cq_sread(cq, buf, count, cond, timeout);
}
ssize_t ferry_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf,
                            uint64_t flags) {
    return fi_cq_readerr(cq, buf, flags);
}
const char *ferry_fi_cq_strerror(struct fid_cq *cq, int prov_errno,
                                 const void *err_data, char *buf, size_t len) {
    return fi_cq_strerror(cq, prov_errno, err_data, buf, len);
}
int ferry_fi_cq_signal(struct fid_cq *cq) { return fi_cq_signal(cq); }
ssize_t ferry_fi_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg,
                          uint64_t flags) {
    return fi_writemsg(ep, msg, flags);
}
ssize_t ferry_fi_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg,
                         uint64_t flags) {
    return fi_readmsg(ep, msg, flags);
}
ssize_t ferry_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                      fi_addr_t src_addr, void *context) {
    return fi_recv(ep, buf, len, desc, src_addr, context);
}
