from django.http import HttpResponse
from django.urls import path
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle  # noqa: F401
from rest_framework.views import APIView

from paceline.django import ratelimit
from paceline.django.rest import ScopedRateThrottle


def home(request):
    return HttpResponse("ok")


@ratelimit(key="header:x-api-key", rate="3/h", method="POST")
def login(request):
    return HttpResponse("welcome")


@ratelimit(key="ip", rate="2/h", block=False)
def soft(request):
    return HttpResponse("limited" if request.limited else "fine")


@ratelimit(key="get:user", rate="2/h")
async def async_view(request):
    return HttpResponse("async ok")


class Things(APIView):
    def get(self, request):
        return Response({"things": []})


class Uploads(APIView):
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "uploads"

    def post(self, request):
        return Response({"uploaded": True})


urlpatterns = [
    path("", home),
    path("login", login),
    path("soft", soft),
    path("async", async_view),
    path("api/things", Things.as_view()),
    path("api/uploads", Uploads.as_view()),
]
