from django.contrib import admin, messages
from django.db import transaction
from django.utils.translation import ngettext

from . import services
from .models import Order, Refund


class RefundInline(admin.TabularInline):
    model = Refund
    extra = 0
    fields = ("amount", "status", "checks", "requested_at", "decided_at")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "customer", "total", "status", "created_at", "paid_at", "closed_at")
    list_filter = ("status",)
    fields = ("customer", "total")
    inlines = (RefundInline,)
    actions = ("mark_paid", "request_full_refund")

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if not change:
            services.schedule_timeout(obj)  # in the admin's transaction: Redis on commit

    @admin.action(description="Mark selected orders paid (cancels their timeout)")
    def mark_paid(self, request, queryset):
        paid = sum(services.pay(order) for order in queryset)
        self.message_user(request, ngettext("%(n)d order paid", "%(n)d orders paid", paid)
                          % {"n": paid}, messages.SUCCESS)

    @admin.action(description="Request a full refund of selected paid orders")
    def request_full_refund(self, request, queryset):
        with transaction.atomic():
            refunds = [services.request_refund(order, order.total)
                       for order in queryset.filter(status=Order.Status.PAID)]
        self.message_user(request, ngettext("%(n)d refund requested", "%(n)d refunds requested",
                                            len(refunds)) % {"n": len(refunds)},
                          messages.SUCCESS)


@admin.register(Refund)
class RefundAdmin(admin.ModelAdmin):
    list_display = ("id", "order", "amount", "status", "checks", "requested_at", "decided_at")
    list_filter = ("status",)
    fields = ("order", "amount")

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if not change:
            services.schedule_check(obj, 0)
